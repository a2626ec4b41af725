/*
 * src/providers/http.c - the HTTP providers' shared half: the provider
 * object, one libcurl transfer per request, and the rules that turn a
 * failed exchange into an ag_provider_error.
 *
 * Layers. Providers depend on base, core, the agent's model interface
 * (include/agentguard/providers.h, exec.h's cancellation token) and the
 * wire layer: the API's shape (src/wire/: ag__wire, one per API) builds
 * the request, reads the reply and its stream; this file asks its table
 * and never which shape it holds. libcurl is used here and in the proxy,
 * each for its own transfers.
 *
 * Data structures. A provider owns one multi handle and one easy handle,
 * both reused for every request so that keep-alive connections are reused
 * too; the header lists (with the API key in them) are built once. The key
 * lives only in the provider's memory and in the header list curl is given;
 * every message and details buffer is scrubbed of it before it is returned.
 * A request's state is a `xfer` on the stack: the response body (capped),
 * or an SSE parser feeding the wire's event function, which feeds an
 * ag__asm (text, refusal, calls by wire index, usage; every part capped).
 * Every growing text - the body, the SSE line and event, the reply's text,
 * refusal and call arguments - is the base layer's ag__buf with its cap.
 *
 * Threading and cancellation. A provider is used by one thread at a time.
 * The transfer runs on curl's multi interface with curl_multi_poll, whose
 * extra descriptors are the cancellation token's eventfds: a cancel from
 * any thread wakes the poll at once; deadlines bound the poll's timeout
 * (100 ms at most), so a turn deadline, the idle limit and Ctrl-C all end a
 * request within that. curl's own progress callback fires only about once
 * a second on a quiet connection, which is why it is not the mechanism.
 *
 * Rejected: retrying here (the loop retries, with events); following
 * redirects (an API that moves should be configured, and a redirect to
 * another host must not receive the key: a 3xx is a permanent error naming
 * the new address); CURLOPT_LOW_SPEED_* for the idle limit (whole seconds
 * only, and it also fires while a local server is still reading a long
 * prompt before a non-streamed answer).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <limits.h>

#include <curl/curl.h>

#include "agentguard/base.h"

#include "../core/internal.h"
#include "internal.h"

/* Widths (%.*s, or characters kept) of outside text quoted in a message,
 * so that each message keeps its own words within its buffer. */
#define SHOWN_TOKEN 40         /* an API's error type or code, a kind */
#define SHOWN_NAME 60          /* an environment variable's or header's name */
#define SHOWN_LOCATION 120     /* a redirect's Location */
#define SHOWN_BASE_URL 200     /* provider.base_url */
#define BODY_EXCERPT_CHARS 200 /* an error body that is not the API's JSON */

#define MAX_BASE_URL 4096 /* bytes of provider.base_url */

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

/* Replaces every occurrence of `key` in buf (NUL-terminated, cap bytes) by
 * "[redacted]"; what no longer fits is cut. */
static void redact(char *buf, size_t cap, const char *key) {
  static const char mark[] = "[redacted]";
  const size_t ml = sizeof(mark) - 1;
  size_t kl = key != NULL ? strlen(key) : 0;
  if (kl < 4 || cap == 0)
    return;
  char *from = buf;
  char *p;
  while ((p = strstr(from, key)) != NULL) {
    size_t off = (size_t)(p - buf);
    if (off + ml >= cap) {
      *p = '\0'; /* no room for the mark: cut the key off */
      return;
    }
    size_t tail = strlen(p + kl);
    size_t room = cap - 1 - off - ml;
    if (tail > room)
      tail = room;
    memmove(p + ml, p + kl, tail);
    memcpy(p, mark, ml);
    p[ml + tail] = '\0';
    from = p + ml; /* never search the mark itself */
  }
}

/* ------------------------------------------------------------------------ */
/* The provider                                                             */
/* ------------------------------------------------------------------------ */

typedef struct http_provider {
  const ag__wire *wire; /* the API's shape (src/wire/) */
  char *url;            /* the endpoint */
  char service[64];     /* its host, for messages */
  char *key_env;        /* the variable's name, for messages */
  char *api_key;        /* NULL: none was set */
  char *model;
  json_t *extra; /* extra_body, or NULL */
  ag__wire_opts wopts;
  struct curl_slist *headers;
  int64_t timeout_ms, connect_timeout_ms, idle_timeout_ms;
  CURL *easy;
  CURLM *multi;
} http_provider;

static void http_destroy(void *self) {
  http_provider *p = self;
  if (p == NULL)
    return;
  if (p->multi != NULL)
    curl_multi_cleanup(p->multi);
  if (p->easy != NULL)
    curl_easy_cleanup(p->easy);
  curl_slist_free_all(p->headers);
  if (p->api_key != NULL) {
    /* Not a security boundary (the process had it in its environment), but
     * freed memory should not keep it either. */
    volatile char *k = p->api_key;
    while (*k)
      *k++ = '\0';
  }
  free(p->api_key);
  free(p->url);
  free(p->key_env);
  free(p->model);
  json_decref(p->extra);
  free(p);
}

/* One request's state, shared with curl's callbacks. */
typedef struct xfer {
  http_provider *p;
  ag__asm *asmb;
  long status;
  bool decided;  /* the body's mode is known */
  bool sse;      /* 2xx and text/event-stream */
  bool body_2xx; /* a 2xx body is being buffered */
  ag__buf body;  /* capped when the status is known (on_write) */
  bool too_big;
  bool nomem;
  bool stopped; /* a callback asked curl to stop */
  ag__sse sse_p;
  char content_type[128];
  char location[512];
  int64_t retry_after_ms;
  int64_t retry_after_ms_hdr; /* retry-after-ms, or -1 */
  int64_t last_rx;
} xfer;

static int sse_event(void *user, const char *event, const char *data,
                     size_t len, size_t pos) {
  xfer *x = user;
  return x->p->wire->event(x->asmb, event, data, len, pos);
}

static int64_t parse_retry_after(const char *v) {
  while (*v == ' ' || *v == '\t')
    v++;
  if (isdigit((unsigned char)*v)) {
    char *end;
    errno = 0;
    double secs = strtod(v, &end);
    while (*end == ' ' || *end == '\t')
      end++;
    if (errno == 0 && *end == '\0' && secs >= 0 && secs < 1e9)
      return (int64_t)(secs * 1000.0);
  }
  time_t t = curl_getdate(v, NULL);
  if (t == (time_t)-1)
    return -1;
  time_t now = time(NULL);
  return t <= now ? 0 : (int64_t)(t - now) * 1000;
}

static size_t on_header(char *buf, size_t size, size_t n, void *user) {
  xfer *x = user;
  size_t len = size * n;
  x->last_rx = ag_now_ms();
  if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) {
    /* A new response (after a 100 Continue): forget the last one's. */
    x->content_type[0] = '\0';
    x->location[0] = '\0';
    x->retry_after_ms = -1;
    x->retry_after_ms_hdr = -1;
    return len;
  }
  const char *colon = memchr(buf, ':', len);
  if (colon == NULL)
    return len;
  size_t nl = (size_t)(colon - buf);
  const char *v = colon + 1;
  size_t vl = len - nl - 1;
  while (vl > 0 && (*v == ' ' || *v == '\t')) {
    v++;
    vl--;
  }
  while (vl > 0 && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
    vl--;
  char val[512];
  size_t c = vl < sizeof(val) - 1 ? vl : sizeof(val) - 1;
  memcpy(val, v, c);
  val[c] = '\0';
  if (nl == 11 && strncasecmp(buf, "retry-after", 11) == 0) {
    x->retry_after_ms = parse_retry_after(val);
  } else if (nl == 14 && strncasecmp(buf, "retry-after-ms", 14) == 0) {
    char *end;
    double ms = strtod(val, &end);
    if (end != val && ms >= 0 && ms < 1e12)
      x->retry_after_ms_hdr = (int64_t)ms;
  } else if (nl == 12 && strncasecmp(buf, "content-type", 12) == 0) {
    ag__scopy(x->content_type, sizeof(x->content_type), val);
  } else if (nl == 8 && strncasecmp(buf, "location", 8) == 0) {
    ag__scopy(x->location, sizeof(x->location), val);
  }
  return len;
}

static bool ci_contains(const char *hay, const char *needle) {
  size_t nl = strlen(needle);
  for (const char *h = hay; *h; h++)
    if (strncasecmp(h, needle, nl) == 0)
      return true;
  return false;
}

static size_t on_write(char *buf, size_t size, size_t n, void *user) {
  xfer *x = user;
  size_t len = size * n;
  x->last_rx = ag_now_ms();
  if (!x->decided) {
    curl_easy_getinfo(x->p->easy, CURLINFO_RESPONSE_CODE, &x->status);
    x->decided = true;
    bool ok = x->status >= 200 && x->status < 300;
    x->sse = ok && ci_contains(x->content_type, "text/event-stream");
    x->body_2xx = ok;
    ag__buf_init(&x->body, ok ? AG__HTTP_BODY_MAX : AG__HTTP_ERRBODY_MAX);
  }
  if (x->sse) {
    ag_err_t why = AG_OK;
    int r = ag__sse_feed(&x->sse_p, buf, len, &why);
    if (r < 0) {
      if (why == AG_ETOOBIG)
        ag__asm_bad(x->asmb, (long)x->sse_p.consumed,
                    "an event or line of the stream exceeds %u bytes",
                    AG__SSE_EVENT_MAX);
      else
        x->nomem = true;
    }
    if (r != 0) {
      x->stopped = true;
      return 0; /* CURLE_WRITE_ERROR: curl stops */
    }
    return len;
  }
  size_t room = x->body.cap - x->body.len;
  if (!x->body_2xx && room == 0)
    return len; /* an error body: keep its beginning only */
  size_t take = !x->body_2xx && len > room ? room : len;
  ag_err_t rc = ag__buf_add(&x->body, buf, take);
  if (rc == AG_ETOOBIG) {
    x->too_big = true;
    x->stopped = true;
    return 0;
  }
  if (rc != AG_OK) {
    x->nomem = true;
    x->stopped = true;
    return 0;
  }
  return len;
}

/* Runs the transfer until it ends, the token fires or the stream goes
 * quiet. Returns the curl result; *cancelled / *idle say why it was cut. */
static CURLcode run_transfer(http_provider *p, xfer *x, ag_cancel *cancel,
                             bool *cancelled, bool *idle) {
  *cancelled = false;
  *idle = false;
  if (curl_multi_add_handle(p->multi, p->easy) != CURLM_OK)
    return CURLE_FAILED_INIT;
  CURLcode result = CURLE_OK;
  bool finished = false;
  x->last_rx = ag_now_ms();
  for (;;) {
    int running = 0;
    CURLMcode mc = curl_multi_perform(p->multi, &running);
    if (mc != CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
    int left;
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(p->multi, &left)) != NULL) {
      if (msg->msg == CURLMSG_DONE) {
        result = msg->data.result;
        finished = true;
      }
    }
    if (finished || running == 0)
      break;
    int64_t now = ag_now_ms();
    if (ag_cancel_check(cancel, now) != AG_CANCEL_NONE) {
      *cancelled = true;
      break;
    }
    int64_t wait = 100;
    if (p->idle_timeout_ms > 0 && x->sse) {
      int64_t left_ms = x->last_rx + p->idle_timeout_ms - now;
      if (left_ms <= 0) {
        *idle = true;
        break;
      }
      if (left_ms < wait)
        wait = left_ms;
    } else if (p->idle_timeout_ms > 0 && !x->decided && p->wopts.stream) {
      /* A stream that has not started: the same limit from the request. */
      int64_t left_ms = x->last_rx + p->idle_timeout_ms - now;
      if (left_ms <= 0) {
        *idle = true;
        break;
      }
      if (left_ms < wait)
        wait = left_ms;
    }
    int fds[8];
    int64_t deadline = INT64_MAX;
    size_t nfd = ag_cancel_fds(cancel, fds, 8, &deadline);
    if (deadline != INT64_MAX) {
      int64_t d = deadline - now;
      if (d < wait)
        wait = d < 0 ? 0 : d;
    }
    struct curl_waitfd wfd[8];
    for (size_t i = 0; i < nfd; i++) {
      wfd[i].fd = fds[i];
      wfd[i].events = CURL_WAIT_POLLIN;
      wfd[i].revents = 0;
    }
    curl_multi_poll(p->multi, wfd, (unsigned)nfd, (int)wait, NULL);
  }
  curl_multi_remove_handle(p->multi, p->easy);
  return result;
}

static bool transient_status(long s) {
  return s == 408 || s == 409 || s == 429 || (s >= 500 && s <= 599);
}

/* An HTTP status that is not 2xx: the API's own message when it sent one. */
static void http_failure(http_provider *p, xfer *x, ag_provider_error *perr) {
  long s = x->status;
  perr->http_status = (int)s;
  perr->transient = transient_status(s);
  perr->retry_after_ms =
      x->retry_after_ms_hdr >= 0 ? x->retry_after_ms_hdr : x->retry_after_ms;
  /* The key out of the body before anything is cut from it: a cut would
   * leave a prefix of the key that no later redaction recognises. */
  if (x->body.p != NULL && p->api_key != NULL &&
      strstr(x->body.p, p->api_key) != NULL) {
    /* In place, within the allocation (never more than the cap). */
    redact(x->body.p, x->body.alloc, p->api_key);
    x->body.len = strlen(x->body.p);
  }
  const char *body = ag__buf_str(&x->body);
  size_t body_len = x->body.len;
  char api[440] = "";
  json_error_t je;
  json_t *j = body_len > 0 ? json_loadb(body, body_len, 0, &je) : NULL;
  if (j != NULL) {
    /* {"error": {...}} (OpenAI and most servers), {"type": "error",
     * "error": {...}} (Anthropic), {"error": "text"} (Ollama), or a bare
     * {"message": ...}. */
    json_t *e = json_object_get(j, "error");
    if (!ag__api_error_message(e, api, sizeof(api)))
      ag__api_error_message(j, api, sizeof(api));
    json_decref(j);
  }
  if (api[0] == '\0' && body_len > 0)
    ag__readable(api, sizeof(api), body, body_len, BODY_EXCERPT_CHARS);
  char what[320] = "";
  if (s == 401 || s == 403) {
    if (p->key_env[0] == '\0')
      snprintf(what, sizeof(what),
               "%s: no API key is sent (provider.api_key_env is \"\")",
               s == 401 ? "the server wants an API key" : "access refused");
    else if (p->api_key == NULL)
      snprintf(what, sizeof(what),
               "the API key is missing: set the environment variable %.*s",
               SHOWN_NAME, p->key_env);
    else
      snprintf(what, sizeof(what),
               "the API key in the environment variable %.*s was %s",
               SHOWN_NAME, p->key_env,
               s == 401 ? "refused" : "refused for this request");
  } else if (s >= 300 && s < 400) {
    snprintf(what, sizeof(what),
             "the server redirects to %.*s; redirects are not followed: "
             "set provider.base_url to the new address",
             SHOWN_LOCATION,
             x->location[0] != '\0' ? x->location : "(no Location)");
  } else if (s == 404) {
    snprintf(what, sizeof(what),
             "not found: check provider.base_url and "
             "provider.model");
  }
  if (what[0] != '\0' && api[0] != '\0')
    ag__perr_set(perr, "HTTP %ld from %s: %s: %s", s, p->service, what, api);
  else if (what[0] != '\0' || api[0] != '\0')
    ag__perr_set(perr, "HTTP %ld from %s: %s", s, p->service,
                 what[0] != '\0' ? what : api);
  else
    ag__perr_set(perr, "HTTP %ld from %s", s, p->service);
  size_t dl = body_len < sizeof(perr->details) - 1 ? body_len
                                                   : sizeof(perr->details) - 1;
  memcpy(perr->details, body, dl);
  perr->details[dl] = '\0';
}

static void net_failure(http_provider *p, CURLcode cc, const char *errbuf,
                        bool started, ag_provider_error *perr) {
  perr->http_status = 0;
  perr->transient = true;
  const char *why = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(cc);
  if (cc == CURLE_OPERATION_TIMEDOUT) {
    if (!started && p->connect_timeout_ms > 0 &&
        strstr(errbuf, "onnect") != NULL)
      ag__perr_set(perr,
                   "connecting to %s timed out after %lld ms "
                   "(provider.connect_timeout)",
                   p->service, (long long)p->connect_timeout_ms);
    else
      ag__perr_set(
          perr, "the request to %s timed out after %lld ms (provider.timeout)",
          p->service, (long long)p->timeout_ms);
  } else if (started) {
    ag__perr_set(perr, "the reply from %s was cut off: %s", p->service, why);
  } else {
    ag__perr_set(perr, "could not reach %s: %s", p->service, why);
  }
}

/* The request body in the wire's format, or NULL with *rc set (AG_ENOMEM,
 * or AG_EPROVIDER with perr saying why). */
static char *build_request(http_provider *p, const ag_request *req, size_t *len,
                           ag_err_t *rc, ag_provider_error *perr) {
  ag_err_t brc = AG_OK;
  char bmsg[256] = "";
  char *body = p->wire->request(&p->wopts, req, len, &brc, bmsg, sizeof(bmsg));
  *rc = AG_OK;
  if (body != NULL)
    return body;
  if (brc == AG_ENOMEM) {
    *rc = AG_ENOMEM;
    return NULL;
  }
  perr->transient = false;
  ag__perr_set(perr, "the request for %s could not be built: %s", p->service,
               bmsg);
  *rc = AG_EPROVIDER;
  return NULL;
}

/* Sets the provider's easy handle up for one POST of `body` into `x`. */
static void setup_easy(http_provider *p, xfer *x, const char *body,
                       size_t body_len, char *errbuf) {
  CURL *e = p->easy;
  curl_easy_reset(e);
  curl_easy_setopt(e, CURLOPT_URL, p->url);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, p->headers);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "agentguard/" AG_VERSION_STRING);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  if (p->timeout_ms > 0)
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)p->timeout_ms);
  if (p->connect_timeout_ms > 0)
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)p->connect_timeout_ms);
}

/* A 2xx stream that ended: the event left without its blank line, then
 * whether the reply was complete. */
static ag_err_t finish_stream(http_provider *p, xfer *x, ag__asm *a,
                              ag_provider_error *perr) {
  ag_err_t why = AG_OK;
  int r = ag__sse_finish(&x->sse_p, &why);
  if (r < 0 && why == AG_ENOMEM)
    return AG_ENOMEM;
  if (a->delta_stopped)
    return AG_ECANCELLED;
  if (a->failed != AG_OK)
    return a->failed;
  if (!a->done && a->finish_reason[0] == '\0') {
    perr->transient = true;
    ag__perr_set(perr,
                 "the stream from %s ended before the reply was complete "
                 "(after %zu bytes, no %s)",
                 p->service, x->sse_p.consumed, p->wire->end_marker);
    return AG_EPROVIDER;
  }
  return AG_OK;
}

/* A 2xx body that was not streamed: the wire's reader fills the
 * assembler. */
static ag_err_t read_body(http_provider *p, xfer *x, ag__asm *a) {
  p->wire->response(a, ag__buf_str(&x->body), x->body.len);
  return a->delta_stopped ? AG_ECANCELLED : a->failed;
}

/* How a transfer ended, in order of precedence: cancelled, out of memory,
 * idle, an HTTP error status, a broken reply, too big a body, a network
 * error; else the reply is read. */
static ag_err_t transfer_outcome(http_provider *p, xfer *x, ag__asm *a,
                                 CURLcode cc, bool cancelled, bool idle,
                                 const char *errbuf, ag_provider_error *perr) {
  if (cancelled || a->delta_stopped)
    return AG_ECANCELLED;
  if (x->nomem || a->failed == AG_ENOMEM)
    return AG_ENOMEM;
  if (idle) {
    perr->transient = true;
    perr->http_status = 0;
    ag__perr_set(perr, "%s sent nothing for %lld ms (provider.idle_timeout)",
                 p->service, (long long)p->idle_timeout_ms);
    return AG_EPROVIDER;
  }
  if (x->status > 0 && (x->status < 200 || x->status >= 300)) {
    http_failure(p, x, perr);
    return AG_EPROVIDER;
  }
  if (a->failed != AG_OK)
    return a->failed == AG_ETOOBIG ? AG_EPROVIDER : a->failed;
  if (x->too_big) {
    ag__asm_bad(a, (long)AG__HTTP_BODY_MAX, "the body exceeds %u bytes",
                AG__HTTP_BODY_MAX);
    return AG_EPROVIDER;
  }
  if (cc != CURLE_OK) {
    net_failure(p, cc, errbuf, x->decided, perr);
    return AG_EPROVIDER;
  }
  return x->sse ? finish_stream(p, x, a, perr) : read_body(p, x, a);
}

/* A failed request's last touches: the 2xx status of a broken reply, the
 * error body as details, and the key scrubbed from both texts. */
static void finish_failure(http_provider *p, const xfer *x, const ag__asm *a,
                           ag_provider_error *perr) {
  /* A 2xx whose body broke the API's promise: say which status came. */
  if (perr->http_status == 0 && x->status >= 200 && x->status < 300 &&
      a->failed == AG_EPROVIDER && !perr->transient)
    perr->http_status = (int)x->status;
  if (perr->details[0] == '\0' && x->body.p != NULL && !x->body_2xx)
    ag__scopy(perr->details, sizeof(perr->details), x->body.p);
  redact(perr->message, sizeof(perr->message), p->api_key);
  redact(perr->details, sizeof(perr->details), p->api_key);
}

static ag_err_t http_complete(void *self, const ag_request *req,
                              ag_cancel *cancel, ag_delta_fn on_delta,
                              void *delta_user, ag_reply *out,
                              ag_provider_error *perr) {
  http_provider *p = self;
  ag__scopy(perr->service, sizeof(perr->service), p->service);
  size_t body_len = 0;
  ag_err_t rc;
  char *body = build_request(p, req, &body_len, &rc, perr);
  if (body == NULL)
    return rc;

  ag__asm a;
  ag__asm_init(&a, on_delta, delta_user, perr, p->service);
  xfer x;
  memset(&x, 0, sizeof(x));
  x.p = p;
  x.asmb = &a;
  x.retry_after_ms = -1;
  x.retry_after_ms_hdr = -1;
  ag__sse_init(&x.sse_p, sse_event, &x);

  char errbuf[CURL_ERROR_SIZE];
  errbuf[0] = '\0';
  setup_easy(p, &x, body, body_len, errbuf);
  bool cancelled = false, idle = false;
  CURLcode cc = run_transfer(p, &x, cancel, &cancelled, &idle);
  if (x.status == 0)
    curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &x.status);
  free(body);

  rc = transfer_outcome(p, &x, &a, cc, cancelled, idle, errbuf, perr);
  if (rc == AG_OK)
    rc = ag__asm_finish(&a, out);
  if (rc == AG_EPROVIDER)
    finish_failure(p, &x, &a, perr);
  ag__asm_free(&a);
  ag__sse_free(&x.sse_p);
  ag__buf_free(&x.body);
  return rc;
}

/* Both wire formats read ag_request.messages_json (wire/chat.c splices it
 * into the body, wire/messages.c parses it where it converts). */
/* One vtable per shape, named by the shape's provider kind, in
 * ag__wire_all's order; filled once (curl_init). */
#define SHAPES_MAX 8
static ag_provider_vtable vtables[SHAPES_MAX];

/* The kinds' names, NULL-terminated (ag_http_provider_kinds). */
static const char *kinds_list[SHAPES_MAX + 1];
static void fill_kinds(void) {
  for (size_t i = 0; i < SHAPES_MAX && ag__wire_all[i] != NULL; i++)
    kinds_list[i] = ag__wire_all[i]->name;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_OK;
static void curl_init(void) {
  curl_init_rc = (CURLcode)ag__curl_init(); /* src/base/curl.c */
  for (size_t i = 0; i < SHAPES_MAX && ag__wire_all[i] != NULL; i++)
    vtables[i] = (ag_provider_vtable){sizeof(ag_provider_vtable),
                                      ag__wire_all[i]->name, http_complete,
                                      http_destroy, AG_PROVIDER_MESSAGES_TEXT};
}

AG_EXTERN const char *const *ag_http_provider_kinds(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fill_kinds);
  return kinds_list;
}

static const ag_provider_vtable *vtable_of(const ag__wire *w) {
  size_t i = 0;
  while (i + 1 < SHAPES_MAX && ag__wire_all[i] != w)
    i++;
  return &vtables[i];
}

AG_EXTERN void ag_http_provider_opts_init(ag_http_provider_opts *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof(*o));
  o->size = sizeof(*o);
  o->kind = "openai";
  o->connect_timeout_ms = 10000;
  o->idle_timeout_ms = 120000;
  o->stream = true;
  o->temperature = -1;
  o->parallel_tool_calls = true;
}

static bool header_ok(const char *h) {
  const char *colon = strchr(h, ':');
  if (colon == NULL || colon == h)
    return false;
  for (const char *c = h; *c; c++)
    if (*c == '\r' || *c == '\n')
      return false;
  for (const char *c = h; c < colon; c++)
    if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '_'))
      return false;
  return true;
}

static bool add_header(struct curl_slist **l, const char *h) {
  struct curl_slist *n = curl_slist_append(*l, h);
  if (n == NULL)
    return false;
  *l = n;
  return true;
}

static ag_err_t oom(ag_error_t *err) {
  return ag__set_error(err, AG_ENOMEM, -1, "out of memory creating a provider");
}

/* The options a provider cannot start with, before anything is made; the
 * wire format from o->kind. */
static ag_err_t check_opts(const ag_http_provider_opts *o,
                           const ag__wire **wire, ag_error_t *err) {
  if (o->size != sizeof(ag_http_provider_opts))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_provider_http_new: opts.size is %zu, expected "
                         "%zu (call ag_http_provider_opts_init)",
                         o->size, sizeof(ag_http_provider_opts));
  const char *kind = o->kind != NULL ? o->kind : "openai";
  *wire = ag__wire_named(kind);
  if (*wire == NULL) {
    char kinds[128];
    ag__wire_names(kinds, sizeof kinds);
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.kind: \"%.*s\" is not a provider kind "
                         "(%s)",
                         SHOWN_TOKEN, kind, kinds);
  }
  if (o->model == NULL || o->model[0] == '\0')
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.model: missing; name the model to use "
                         "(or set AGENTGUARD_MODEL)");
  if (o->timeout_ms < 0 || o->connect_timeout_ms < 0 ||
      o->idle_timeout_ms < 0 || o->timeout_ms > LONG_MAX ||
      o->connect_timeout_ms > LONG_MAX)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider: timeouts must be >= 0");
  if (o->max_tokens < 0)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.max_tokens: expected an integer >= 0");
  if (!isnan(o->temperature) && o->temperature > 2.0)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.temperature: expected 0..2");
  return AG_OK;
}

/* p->url: the base URL (or the wire's default) without trailing slashes,
 * then the wire's path; p->service: its host. Only http and https. */
static ag_err_t set_url(http_provider *p, const ag_http_provider_opts *o,
                        ag_error_t *err) {
  const char *base = o->base_url;
  if (base == NULL || base[0] == '\0')
    base = p->wire->base_url;
  const char *path = p->wire->suffix;
  char named[300];
  if (p->wire->url_path != NULL) {
    if (o->model == NULL ||
        !p->wire->url_path(o->model, o->stream, named, sizeof named))
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.model: \"%.100s\" cannot be put in a %s "
                           "URL (letters, digits, '-', '.' and '_' only)",
                           o->model != NULL ? o->model : "", p->wire->api);
    path = named;
  }
  size_t bl = strlen(base);
  while (bl > 0 && base[bl - 1] == '/')
    bl--;
  if (bl > MAX_BASE_URL)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.base_url: longer than %d bytes",
                         MAX_BASE_URL);
  p->url = malloc(bl + strlen(path) + 1);
  if (p->url == NULL)
    return oom(err);
  memcpy(p->url, base, bl);
  strcpy(p->url + bl, path);

  CURLU *u = curl_url();
  if (u == NULL)
    return oom(err);
  char *scheme = NULL, *host = NULL;
  CURLUcode uc = curl_url_set(u, CURLUPART_URL, p->url, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(u, CURLUPART_HOST, &host, 0);
  bool ok = uc == CURLUE_OK &&
            (strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0);
  if (ok)
    ag__scopy(p->service, sizeof(p->service), host);
  curl_free(scheme);
  curl_free(host);
  curl_url_cleanup(u);
  if (!ok)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.base_url: \"%.*s\" is not an http:// or "
                         "https:// URL",
                         SHOWN_BASE_URL, base);
  return AG_OK;
}

/* The model's name, the key's variable and the key itself, read from the
 * environment now (none when the variable is unset or empty). */
static ag_err_t load_key(http_provider *p, const ag_http_provider_opts *o,
                         ag_error_t *err) {
  const char *env = o->api_key_env;
  if (env == NULL)
    env = p->wire->key_env;
  p->key_env = ag__strdup(env);
  p->model = ag__strdup(o->model);
  if (p->key_env == NULL || p->model == NULL)
    return oom(err);
  if (env[0] == '\0')
    return AG_OK;
  const char *k = getenv(env);
  if (k == NULL || k[0] == '\0')
    return AG_OK;
  for (const char *c = k; *c; c++)
    if ((unsigned char)*c < 0x20)
      return ag__set_error(err, AG_ECONFIG, -1,
                           "the environment variable %.*s holds a control "
                           "character: not an API key",
                           SHOWN_NAME, env);
  p->api_key = ag__strdup(k);
  return p->api_key != NULL ? AG_OK : oom(err);
}

/* provider.extra_body: a JSON object merged into every request. */
static ag_err_t load_extra(http_provider *p, const ag_http_provider_opts *o,
                           ag_error_t *err) {
  if (o->extra_body_json == NULL)
    return AG_OK;
  json_error_t je;
  p->extra = json_loads(o->extra_body_json, JSON_REJECT_DUPLICATES, &je);
  if (p->extra == NULL && AG__JSON_NOMEM(&je))
    return oom(err);
  if (!json_is_object(p->extra))
    return ag__set_error(err, AG_ECONFIG, p->extra == NULL ? je.position : -1,
                         "provider.extra_body: %s",
                         p->extra == NULL ? je.text : "expected an object");
  return AG_OK;
}

/* The key's header ("Authorization: Bearer ..." or "x-api-key: ..."); the
 * temporary text is wiped before it is freed. */
static bool add_key_header(http_provider *p) {
  size_t kl = strlen(p->api_key);
  char *h = malloc(kl + 32);
  if (h == NULL)
    return false;
  snprintf(h, kl + 32, "%s%s", p->wire->key_header, p->api_key);
  bool ok = add_header(&p->headers, h);
  memset(h, 0, kl + 32);
  free(h);
  return ok;
}

/* The request headers, built once: ours first, then the user's. */
static ag_err_t build_headers(http_provider *p, const ag_http_provider_opts *o,
                              ag_error_t *err) {
  if (!add_header(&p->headers, "Content-Type: application/json") ||
      !add_header(&p->headers, o->stream ? "Accept: text/event-stream"
                                         : "Accept: application/json") ||
      !add_header(&p->headers, "Expect:"))
    return oom(err);
  if (p->wire->extra_header != NULL &&
      !add_header(&p->headers, p->wire->extra_header))
    return oom(err);
  if (p->api_key != NULL && !add_key_header(p))
    return oom(err);
  for (size_t i = 0; o->headers != NULL && o->headers[i] != NULL; i++) {
    if (!header_ok(o->headers[i])) {
      /* Only the name: the value may be a secret. */
      const char *colon = strchr(o->headers[i], ':');
      int nl = colon != NULL ? (int)(colon - o->headers[i]) : 0;
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.headers[%zu]: expected \"Name: value\" "
                           "with a token name and no line break (name "
                           "\"%.*s\")",
                           i, nl > SHOWN_NAME ? SHOWN_NAME : nl, o->headers[i]);
    }
    if (!add_header(&p->headers, o->headers[i]))
      return oom(err);
  }
  return AG_OK;
}

/* Everything the provider keeps from the options, then its curl handles. */
static ag_err_t provider_setup(http_provider *p, const ag_http_provider_opts *o,
                               ag_error_t *err) {
  ag_err_t rc = set_url(p, o, err);
  if (rc == AG_OK)
    rc = load_key(p, o, err);
  if (rc == AG_OK)
    rc = load_extra(p, o, err);
  if (rc != AG_OK)
    return rc;
  p->wopts.model = p->model;
  p->wopts.stream = o->stream;
  p->wopts.temperature = o->temperature;
  p->wopts.max_tokens = o->max_tokens;
  p->wopts.parallel_tool_calls = o->parallel_tool_calls;
  p->wopts.extra_body = p->extra;
  p->timeout_ms = o->timeout_ms;
  p->connect_timeout_ms = o->connect_timeout_ms;
  p->idle_timeout_ms = o->idle_timeout_ms;
  rc = build_headers(p, o, err);
  if (rc != AG_OK)
    return rc;
  p->easy = curl_easy_init();
  p->multi = curl_multi_init();
  return p->easy != NULL && p->multi != NULL ? AG_OK : oom(err);
}

AG_EXTERN ag_err_t ag_http_provider_check(const ag_http_provider_opts *o,
                                          ag_error_t *err) {
  if (o == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_http_provider_check: opts is NULL");
  const ag__wire *wire = NULL;
  ag_err_t rc = check_opts(o, &wire, err);
  if (rc != AG_OK)
    return rc;
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK)
    return ag__set_error(err, AG_EIO, -1, "libcurl failed to start: %s",
                         curl_easy_strerror(curl_init_rc));
  http_provider p;
  memset(&p, 0, sizeof p);
  p.wire = wire;
  rc = set_url(&p, o, err);
  CURL *e = rc == AG_OK ? curl_easy_init() : NULL;
  if (rc == AG_OK && e == NULL)
    rc = oom(err);
  if (rc != AG_OK) {
    free(p.url);
    return rc;
  }
  /* connect (and for https, the TLS handshake) only: no request is sent */
  char errbuf[CURL_ERROR_SIZE] = "";
  int64_t ct = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 10000;
  curl_easy_setopt(e, CURLOPT_URL, p.url);
  curl_easy_setopt(e, CURLOPT_CONNECT_ONLY, 1L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)ct);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  CURLcode cc = curl_easy_perform(e);
  if (cc != CURLE_OK) {
    const char *why = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(cc);
    if (cc == CURLE_OPERATION_TIMEDOUT)
      rc = ag__set_error(err, AG_EPROVIDER, -1,
                         "could not reach %s (%s): no answer within %lld ms",
                         p.service, p.url, (long long)ct);
    else
      rc = ag__set_error(err, AG_EPROVIDER, -1, "could not reach %s (%s): %s",
                         p.service, p.url, why);
  }
  curl_easy_cleanup(e);
  free(p.url);
  return rc;
}

AG_EXTERN ag_err_t ag_provider_http_new(ag_provider **out,
                                        const ag_http_provider_opts *o,
                                        ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  if (out == NULL || o == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "ag_provider_http_new: %s is NULL",
                         out == NULL ? "out" : "opts");
  const ag__wire *wire = NULL;
  ag_err_t rc = check_opts(o, &wire, err);
  if (rc != AG_OK)
    return rc;
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK)
    return ag__set_error(err, AG_EIO, -1, "libcurl failed to start: %s",
                         curl_easy_strerror(curl_init_rc));

  http_provider *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  p->wire = wire;
  rc = provider_setup(p, o, err);
  if (rc != AG_OK) {
    http_destroy(p);
    return rc;
  }
  return ag_provider_new(out, vtable_of(wire), p, err);
}
