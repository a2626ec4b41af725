/*
 * agentguard/providers.h - model clients behind one interface.
 *
 * A provider performs ONE model request: it never retries (the agent loop
 * applies the network retry rules (docs/providers.md): network.max_retries,
 * backoff with full jitter, Retry-After, which statuses are retried). Streaming
 * providers report text as it arrives through an optional delta callback and
 * still return the complete reply.
 *
 * Built in: the scripted provider (plays a scenario's model replies) and
 * the HTTP providers (OpenAI-compatible Chat Completions, Anthropic
 * Messages; libcurl). Your own: fill an ag_provider_vtable and wrap it with
 * ag_provider_new.
 *
 * Thread-safety: a provider is called from one thread at a time (the thread
 * running the turn); `cancel` may be fired from any thread.
 */
#ifndef AGENTGUARD_PROVIDERS_H
#define AGENTGUARD_PROVIDERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common.h"
#include "core.h"
#include "exec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tool call in a model reply. All strings owned by the reply. */
typedef struct ag_tool_call {
  char *id; /* the model's call id; generated ("call_<n>") if absent */
  char *name;
  char *arguments; /* JSON text exactly as the model sent it */
  size_t arguments_len;
} ag_tool_call;

/* Token usage of one request, as the provider reports it. */
typedef struct ag_usage {
  int64_t prompt_tokens;     /* input tokens, cached ones included */
  int64_t completion_tokens; /* output tokens */
  int64_t cached_tokens;     /* of prompt_tokens, read from a cache */
} ag_usage;

/* A model reply. Release with ag_reply_clear. */
typedef struct ag_reply {
  char *text; /* assistant text, or NULL */
  ag_tool_call *calls;
  size_t n_calls;
  bool has_usage; /* the provider reported usage */
  ag_usage usage; /* when has_usage (token budget, mechanism 11) */
  char *refusal;  /* the model's refusal (OpenAI's message.refusal), or NULL;
                     when there is no other text it is also `text` */
  char finish_reason[32]; /* the server's own word ("stop", "tool_calls",
                             "length", "end_turn", "tool_use", ...), or "" */
} ag_reply;

/* Frees everything the reply owns and zeroes it. */
AG_EXTERN void ag_reply_clear(ag_reply *r);

/*
 * Adds a call to a reply (copies every string; id may be NULL). For
 * providers building replies. Returns AG_OK or AG_ENOMEM.
 */
AG_EXTERN ag_err_t ag_reply_add_call(ag_reply *r, const char *id,
                                     const char *name, const char *arguments,
                                     size_t arguments_len);

/*
 * What the loop asks. All borrowed for the call. The messages come as a
 * tree (`messages`), as text (`messages_json`), or both; the agent loop
 * sends the text only, and ag_provider_complete parses it into a tree for
 * the call when the provider's vtable does not set
 * AG_PROVIDER_MESSAGES_TEXT (see there). The library fills this struct and
 * providers only read it: fields are only ever appended.
 */
typedef struct ag_request {
  const json_t *messages; /* OpenAI chat messages array, or NULL */
  const json_t *tools;    /* OpenAI tools array, or NULL: no tools offered */
  int turn;               /* 1-based turn of the session */
  int iteration;          /* 1-based iteration of the turn */
  /* (Appended.) The same messages array as compact JSON text, "[...]",
   * messages_json_len bytes (NUL-terminated too), or NULL. From the agent
   * loop: its stored history with the ephemeral error context message when
   * there is one, valid for the call only. */
  const char *messages_json;
  size_t messages_json_len;
} ag_request;

/* Why a request failed (filled when complete() returns AG_EPROVIDER). */
typedef struct ag_provider_error {
  int http_status;        /* 0 for failures below HTTP */
  bool transient;         /* worth retrying: connection, timeout, 408, 429,
                             5xx */
  int64_t retry_after_ms; /* the server's Retry-After, or -1 */
  bool exhausted;         /* a scripted provider ran out of replies */
  char service[64];       /* who answered: "scripted", a host name */
  char message[512];      /* a readable message, never an API key */
  char details[1024];     /* the raw provider body (shown only with
                             errors.include_provider_details) */
  /* `message` only names the HTTP status ("HTTP status 503", a scripted
   * reply's reason phrase): the provider had nothing of its own to say, so
   * the agent's message, which names the status already, leaves it out.
   * Set by the library; a provider that writes its own message leaves it
   * false. (Appended: fields are only ever added at the end.) */
  bool message_is_default;
} ag_provider_error;

/* Streaming text as it arrives; return non-zero to stop the request. */
typedef int (*ag_delta_fn)(void *user, const char *text, size_t len);

typedef struct ag_provider_vtable {
  /*
   * sizeof(ag_provider_vtable) as the provider was compiled: fields are only
   * ever appended, and the library reads only those the size covers.
   * ag_provider_new refuses a size smaller than the first layout (size,
   * kind, complete, destroy) or larger than the library knows.
   */
  size_t size;
  const char *kind; /* "scripted", "openai", ... */
  /*
   * One request. Returns AG_OK with *out filled, AG_EPROVIDER with *perr
   * filled, AG_ECANCELLED when `cancel` fired (check its reason) or when
   * on_delta asked to stop, or AG_ENOMEM. on_delta may be NULL.
   */
  ag_err_t (*complete)(void *self, const ag_request *req, ag_cancel *cancel,
                       ag_delta_fn on_delta, void *delta_user, ag_reply *out,
                       ag_provider_error *perr);
  void (*destroy)(void *self); /* may be NULL */
  /*
   * (Appended.) AG_PROVIDER_* bits. Without AG_PROVIDER_MESSAGES_TEXT (or
   * with a vtable size from before this field), a request that carries its
   * messages only as text gets a tree parsed from it for the call and freed
   * after it: about 10 bytes of heap per byte of JSON and a parse of the
   * whole history on every request. A provider that reads messages_json
   * sets the bit and is spared both.
   */
  unsigned flags;
} ag_provider_vtable;

/* The provider reads ag_request.messages_json when it is set and does not
 * need ag_request.messages (which is then NULL). */
#define AG_PROVIDER_MESSAGES_TEXT 1u

typedef struct ag_provider ag_provider;

/* Wraps a vtable (borrowed, static storage) and its state (steals: destroy
 * is called by ag_provider_free, or at once when ag_provider_new fails).
 * Returns AG_OK and sets *out, AG_EINVAL (out or vt NULL, or no
 * vt->complete) or AG_ENOMEM; *out is NULL on failure (when out is not
 * NULL). `self` may be NULL; `err` may be NULL. */
AG_EXTERN ag_err_t ag_provider_new(ag_provider **out,
                                   const ag_provider_vtable *vt, void *self,
                                   ag_error_t *err);
/* Calls the vtable's destroy (when set) on the provider's state, then frees
 * the handle. Not while a request runs. NULL does nothing. */
AG_EXTERN void ag_provider_free(ag_provider *p);
/* The vtable's kind ("scripted", ...; borrowed, static storage), or
 * "custom" when it has none or `p` is NULL. */
AG_EXTERN const char *ag_provider_kind(const ag_provider *p);
/*
 * Calls the provider's complete(). Before: *out and *perr are zeroed
 * (perr->retry_after_ms = -1); a token that already fired returns
 * AG_ECANCELLED without a request. After: a failure frees any half-built
 * reply; perr's strings are terminated, service defaults to the kind and
 * message to "HTTP status N"; an AG_EPROVIDER while `cancel` fired becomes
 * AG_ECANCELLED. perr may be NULL.
 */
AG_EXTERN ag_err_t ag_provider_complete(ag_provider *p, const ag_request *req,
                                        ag_cancel *cancel, ag_delta_fn on_delta,
                                        void *delta_user, ag_reply *out,
                                        ag_provider_error *perr);

/*
 * The scripted provider (docs/scenarios.md): `turns` (borrowed; copied)
 * is the scenario's "turns" array: [{"user": TEXT, "model": [REPLY...],
 * "repeat_last": bool}]. REPLY: {"text": ...} and/or {"tool_calls":
 * [{"name", "arguments": OBJECT or raw STRING, "id"}]}, or {"provider_error":
 * {"status": 429, "retry_after_ms": 10, "message": ...}}, each with an
 * optional "delay_ms" (a cancellable wait before answering). Request k of turn
 * t gets reply k of turns[t-1]; past the end the last repeats when
 * repeat_last, else AG_EPROVIDER with perr->exhausted. Failed requests
 * (provider_error) consume their reply. Shape errors are AG_ECONFIG naming
 * the path ("turns[1].model[2].tool_calls[0].name: expected a string").
 */
AG_EXTERN ag_err_t ag_provider_scripted_new(ag_provider **out,
                                            const json_t *turns,
                                            ag_error_t *err);

/* ------------------------------------------------------------------------ */
/* HTTP providers: Chat Completions, Anthropic Messages, OpenAI Responses    */
/* ------------------------------------------------------------------------ */

/*
 * Options of an HTTP provider (docs/providers.md has every field with its
 * config key). Fill with ag_http_provider_opts_init, then edit. Strings are
 * borrowed for the ag_provider_http_new call only: it copies them.
 */
typedef struct ag_http_provider_opts {
  size_t size;                 /* sizeof(ag_http_provider_opts), set by _init */
  const char *kind;            /* "openai" (default), "anthropic",
                                  "openai-responses", "gemini" or "ollama"
                                  (ag_http_provider_kinds) */
  const char *base_url;        /* NULL: https://api.openai.com/v1 for openai
                                  and openai-responses,
                                  https://api.anthropic.com for anthropic,
                                  https://generativelanguage.googleapis.com/v1beta
                                  for gemini, http://localhost:11434 for
                                  ollama; the request goes to base_url +
                                  "/chat/completions" (openai), + "/responses"
                                  (openai-responses), + "/v1/messages"
                                  (anthropic), + "/models/<model>:generate
                                  Content" (gemini; streamed:
                                  ":streamGenerateContent?alt=sse") or +
                                  "/api/chat" (ollama) */
  const char *model;           /* required */
  const char *api_key_env;     /* the NAME of the environment variable holding
                                  the key; NULL: OPENAI_API_KEY / ANTHROPIC_API_KEY
                                  / GEMINI_API_KEY / OLLAMA_API_KEY;
                                  "": send no key (local servers) */
  const char *const *headers;  /* extra "Name: value" lines, NULL-terminated,
                                  or NULL */
  int64_t timeout_ms;          /* whole request, ms; 0: no limit (default) */
  int64_t connect_timeout_ms;  /* connecting, ms; default 10000; 0: curl's */
  int64_t idle_timeout_ms;     /* a stream that sends nothing this long fails
                                  (transient); default 120000; 0: no limit */
  bool stream;                 /* Server-Sent Events (default true; ollama
                                  is never streamed) */
  double temperature;          /* < 0: not sent (default -1) */
  int max_tokens;              /* 0: not sent (openai); anthropic sends 4096 */
  bool parallel_tool_calls;    /* default true: sent with tools */
  const char *extra_body_json; /* a JSON object merged into every request
                                  body (its keys win), or NULL */
} ag_http_provider_opts;

/* Sets the defaults above. */
AG_EXTERN void ag_http_provider_opts_init(ag_http_provider_opts *o);

/* The provider kinds (the API shapes the HTTP provider speaks): "openai"
 * (Chat Completions), "anthropic" (Messages), "openai-responses"
 * (Responses), "gemini" (the Gemini API), "ollama" (Ollama's /api/chat); a
 * NULL-terminated list, static.
 * docs/providers.md. */
AG_EXTERN const char *const *ag_http_provider_kinds(void);

/*
 * Creates an HTTP provider. The API key is read from the environment
 * variable named by o->api_key_env now, once, and kept in the provider's
 * memory only: it is never in a message, an error, an event or a dump. A
 * missing variable is not an error here (local servers need no key); a 401
 * or 403 then names the variable.
 *
 * Each request: one libcurl transfer (connection reused between requests),
 * cancelled within about 50 ms when `cancel` fires (curl waits on the
 * token's descriptors); no redirects are followed (a 3xx is a permanent
 * error naming the new address). Failures: AG_EPROVIDER with perr filled
 * (transient for connection failures, timeouts, a stream cut short, 408,
 * 409, 429, 5xx and 529; retry_after_ms from Retry-After in seconds or as
 * an HTTP date, or from retry-after-ms); AG_ECANCELLED; AG_ENOMEM.
 *
 * Returns AG_OK, AG_EINVAL / AG_ECONFIG (err->msg names the field),
 * AG_ENOMEM. Thread-safety: as every provider (one thread at a time).
 */
AG_EXTERN ag_err_t ag_provider_http_new(ag_provider **out,
                                        const ag_http_provider_opts *o,
                                        ag_error_t *err);

/*
 * Whether the server the options name can be reached: a connection to the
 * request URL's host (and for https the TLS handshake), with
 * o->connect_timeout_ms (10 s when 0); no request is sent, no key is read.
 * For a session to say at its start that the server is down, rather than
 * after the first message. Returns AG_OK; AG_EPROVIDER with err->msg
 * naming the host, the URL and why ("could not reach localhost
 * (http://localhost:11434/v1/chat/completions): Failed to connect ...");
 * AG_ECONFIG as ag_provider_http_new for bad options; AG_ENOMEM. Blocks
 * for at most the connect timeout; safe from any thread.
 */
AG_EXTERN ag_err_t ag_http_provider_check(const ag_http_provider_opts *o,
                                          ag_error_t *err);

/*
 * The "provider" section of a config file, parsed. Owns every string its
 * options point to. Keys: kind, base_url, model, api_key_env, headers (an
 * object of name: value strings), timeout, connect_timeout, idle_timeout
 * (durations: "30s", "250ms", "0"), stream, temperature, max_tokens,
 * parallel_tool_calls, extra_body (an object). The environment variables
 * AGENTGUARD_BASE_URL and AGENTGUARD_MODEL, when set and not empty,
 * override base_url and model. An API key in the file ("api_key") is
 * refused: keys come from the environment only.
 */
typedef struct ag_provider_config ag_provider_config;

/*
 * Parses the section from JSON text (`json`, `len` bytes; borrowed) or from
 * a parsed value (`section`, borrowed). Errors are AG_ECONFIG / AG_EJSON
 * naming the key ("provider.modle: unknown key; did you mean model?"), or
 * AG_ENOMEM. *out is NULL on failure; free with ag_provider_config_free.
 */
AG_EXTERN ag_err_t ag_provider_config_parse(ag_provider_config **out,
                                            const char *json, size_t len,
                                            ag_error_t *err);
AG_EXTERN ag_err_t ag_provider_config_from_json(ag_provider_config **out,
                                                const json_t *section,
                                                ag_error_t *err);
/* The options (borrowed: valid until the config is freed; copy the struct
 * to edit it). Whether `timeout` was given is *timeout_set (may be NULL):
 * when it was not, a caller may fill timeout_ms from network.timeout. */
AG_EXTERN const ag_http_provider_opts *
ag_provider_config_opts(const ag_provider_config *c, bool *timeout_set);
/* NULL does nothing. */
AG_EXTERN void ag_provider_config_free(ag_provider_config *c);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_PROVIDERS_H */
