/*
 * src/proxy/otlp.c - the OTLP/HTTP trace exporter (otlp.h).
 *
 * The queue is a ring of span texts under one mutex, held only to move
 * pointers: the loop that pushes never waits for the network. The
 * exporter's thread wakes for a full batch or a second after the oldest
 * span came, takes up to a batch, and posts it as one
 * ExportTraceServiceRequest ({"resourceSpans": [{"resource": ...,
 * "scopeSpans": [{"scope": ..., "spans": [...]}]}]}) with its own libcurl
 * handle: 5 s to connect, 10 s in all. A failed export is dropped and
 * counted (no retry: the next batch is already waiting).
 */
#define _GNU_SOURCE
#include "otlp.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../base/internal.h"
#include "agentguard/common.h"
#include "agentguard/proxy.h"

struct ag__otlp {
  char *url;
  struct curl_slist *headers;
  char *head; /* the request's text before the spans */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv, drained;
  char *ring[AG__OTLP_QUEUE_MAX];
  size_t first, n;   /* under mu */
  int64_t oldest_ms; /* when the oldest queued span came (mono) */
  bool quit, busy;   /* under mu: stopping; a batch is being posted */
  atomic_ullong exported, dropped;
};

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool ag__otlp_random_hex(char *out, size_t bytes) {
  unsigned char r[16];
  if (bytes > sizeof r || RAND_bytes(r, (int)bytes) != 1)
    return false;
  bool zero = true; /* an all-zero id is invalid */
  for (size_t i = 0; i < bytes; i++)
    zero = zero && r[i] == 0;
  if (zero)
    r[0] = 1;
  for (size_t i = 0; i < bytes; i++)
    snprintf(out + 2 * i, 3, "%02x", r[i]);
  return true;
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
  (void)p;
  (void)u;
  return s * n;
}

/* Posts spans[0..n) as one request; true when the collector took it. */
static bool post(ag__otlp *o, char **spans, size_t n) {
  ag__buf b;
  ag__buf_init(&b, (size_t)AG__OTLP_BATCH_MAX * (AG__OTLP_SPAN_MAX + 1) + 4096);
  ag__buf_addstr_cut(&b, o->head);
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      ag__buf_addc_cut(&b, ',');
    ag__buf_addstr_cut(&b, spans[i]);
  }
  ag__buf_addstr_cut(&b, "]}]}]}");
  bool ok = false;
  CURL *h = b.cut ? NULL : curl_easy_init();
  if (h != NULL) {
    curl_easy_setopt(h, CURLOPT_URL, o->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, o->headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, ag__buf_str(&b));
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b.len);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK &&
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK)
      ok = status >= 200 && status < 300;
    curl_easy_cleanup(h);
  }
  ag__buf_free(&b);
  return ok;
}

static void *exporter(void *arg) {
  ag__otlp *o = arg;
  char *batch[AG__OTLP_BATCH_MAX];
  pthread_mutex_lock(&o->mu);
  for (;;) {
    /* a full batch, a second after the oldest span, or the stop */
    while (!o->quit && (o->n == 0 || (o->n < AG__OTLP_BATCH_MAX &&
                                      mono_ms() - o->oldest_ms < 1000))) {
      if (o->n == 0) {
        pthread_cond_wait(&o->cv, &o->mu);
      } else {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t at = o->oldest_ms + 1000;
        ts.tv_sec = (time_t)(at / 1000);
        ts.tv_nsec = (long)(at % 1000) * 1000000L;
        pthread_cond_timedwait(&o->cv, &o->mu, &ts);
      }
    }
    if (o->n == 0) /* and quit */
      break;
    size_t k = 0;
    while (k < AG__OTLP_BATCH_MAX && o->n > 0) {
      batch[k++] = o->ring[o->first];
      o->first = (o->first + 1) % AG__OTLP_QUEUE_MAX;
      o->n--;
    }
    o->oldest_ms = mono_ms(); /* what is left waits a second more at most */
    o->busy = true;
    pthread_mutex_unlock(&o->mu);
    bool ok = post(o, batch, k);
    atomic_fetch_add(ok ? &o->exported : &o->dropped, k);
    for (size_t i = 0; i < k; i++)
      free(batch[i]);
    pthread_mutex_lock(&o->mu);
    o->busy = false;
    pthread_cond_broadcast(&o->drained);
  }
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

/* OTEL_EXPORTER_OTLP_HEADERS' form: "k=v,k2=v2", spaces around each
 * trimmed, into *out (with the Content-Type). */
static ag_err_t parse_headers(const char *spec, struct curl_slist **out,
                              ag_error_t *err) {
  struct curl_slist *l = curl_slist_append(NULL, "Content-Type: "
                                                 "application/json");
  for (const char *s = spec; l != NULL && s != NULL && *s != '\0';) {
    const char *end = strchr(s, ',');
    size_t n = end != NULL ? (size_t)(end - s) : strlen(s);
    while (n > 0 && (*s == ' ' || *s == '\t'))
      s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
      n--;
    if (n > 0) {
      const char *eq = memchr(s, '=', n);
      if (eq == NULL || eq == s || n > 4000 || memchr(s, '\r', n) != NULL ||
          memchr(s, '\n', n) != NULL) {
        curl_slist_free_all(l);
        return ag__set_error(err, AG_EINVAL, -1,
                             "OTLP headers: expected name=value pairs "
                             "separated by commas (a pair of %zu bytes has "
                             "%s)",
                             n, eq == NULL ? "no '='" : "a bad name or value");
      }
      char line[4096];
      snprintf(line, sizeof line, "%.*s: %.*s", (int)(eq - s), s,
               (int)(n - (size_t)(eq - s) - 1), eq + 1);
      struct curl_slist *g = curl_slist_append(l, line);
      if (g == NULL)
        curl_slist_free_all(l);
      l = g;
    }
    s = end != NULL ? end + 1 : NULL;
  }
  if (l == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  *out = l;
  return AG_OK;
}

/* The request's text before the spans: the resource and the scope. */
static char *request_head(const char *service) {
  json_t *res = json_pack(
      "{s:[{s:s, s:{s:s}}, {s:s, s:{s:s}}, {s:s, s:{s:s}}]}", "attributes",
      "key", "service.name", "value", "stringValue",
      service != NULL && service[0] != '\0' ? service : "agentguard-proxy",
      "key", "service.version", "value", "stringValue", ag_version(), "key",
      "telemetry.sdk.name", "value", "stringValue", "agentguard");
  char *rs = res != NULL ? json_dumps(res, JSON_COMPACT) : NULL;
  json_decref(res);
  char *head = NULL;
  if (rs != NULL &&
      asprintf(&head,
               "{\"resourceSpans\":[{\"resource\":%s,\"scopeSpans\":[{"
               "\"scope\":{\"name\":\"agentguard\",\"version\":\"%s\"},"
               "\"spans\":[",
               rs, ag_version()) < 0)
    head = NULL;
  free(rs);
  return head;
}

static void otlp_free(ag__otlp *o) {
  curl_slist_free_all(o->headers);
  free(o->url);
  free(o->head);
  free(o);
}

ag_err_t ag__otlp_start(ag__otlp **out, const char *url, const char *headers,
                        const char *service, ag_error_t *err) {
  *out = NULL;
  if (url == NULL ||
      (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))
    return ag__set_error(err, AG_EINVAL, -1,
                         "OTLP endpoint %s: expected an http:// or https:// "
                         "URL",
                         url != NULL ? url : "(none)");
  CURLcode cc = (CURLcode)ag__curl_init(); /* before a first handle */
  if (cc != CURLE_OK)
    return ag__set_error(err, AG_ENOMEM, -1, "libcurl: %s",
                         curl_easy_strerror(cc));
  ag__otlp *o = calloc(1, sizeof *o);
  if (o == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  ag_err_t rc = parse_headers(headers, &o->headers, err);
  if (rc != AG_OK) {
    otlp_free(o);
    return rc;
  }
  o->url = strdup(url);
  o->head = request_head(service);
  if (o->url == NULL || o->head == NULL) {
    otlp_free(o);
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  }
  pthread_mutex_init(&o->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&o->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&o->drained, NULL);
  /* The exporter's thread takes no asynchronous signal: they are the
   * program's threads' to handle (a Ctrl-C waited for in ppoll). */
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGABRT);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int made = pthread_create(&o->thread, NULL, exporter, o);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (made != 0) {
    pthread_cond_destroy(&o->cv);
    pthread_cond_destroy(&o->drained);
    pthread_mutex_destroy(&o->mu);
    otlp_free(o);
    return ag__set_error(err, AG_ENOMEM, -1,
                         "cannot start the OTLP exporter's thread");
  }
  *out = o;
  return AG_OK;
}

bool ag__otlp_push(ag__otlp *o, char *span) {
  if (o == NULL || span == NULL) {
    free(span);
    return false;
  }
  pthread_mutex_lock(&o->mu);
  bool room = !o->quit && o->n < AG__OTLP_QUEUE_MAX;
  if (room) {
    if (o->n == 0)
      o->oldest_ms = mono_ms();
    o->ring[(o->first + o->n) % AG__OTLP_QUEUE_MAX] = span;
    o->n++;
    if (o->n == 1 || o->n >= AG__OTLP_BATCH_MAX)
      pthread_cond_signal(&o->cv);
  }
  pthread_mutex_unlock(&o->mu);
  if (!room) {
    free(span);
    atomic_fetch_add(&o->dropped, 1);
  }
  return room;
}

void ag__otlp_stop(ag__otlp *o, int64_t timeout_ms) {
  ag__otlp_stop_counted(o, timeout_ms, NULL);
}

void ag__otlp_stop_counted(ag__otlp *o, int64_t timeout_ms,
                           unsigned long long *dropped) {
  if (o == NULL)
    return;
  /* what is queued goes now (the thread does not wait for its second),
   * for at most timeout_ms; what is left then is dropped */
  int64_t until = mono_ms() + timeout_ms;
  pthread_mutex_lock(&o->mu);
  o->oldest_ms = 0;
  pthread_cond_signal(&o->cv);
  while ((o->n > 0 || o->busy) && mono_ms() < until) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&o->drained, &o->mu, &ts);
    o->oldest_ms = 0;
  }
  size_t left = o->n;
  while (o->n > 0) {
    free(o->ring[o->first]);
    o->first = (o->first + 1) % AG__OTLP_QUEUE_MAX;
    o->n--;
  }
  o->quit = true;
  pthread_cond_signal(&o->cv);
  pthread_mutex_unlock(&o->mu);
  atomic_fetch_add(&o->dropped, left);
  pthread_join(o->thread, NULL); /* a post under way ends within 10 s */
  if (dropped != NULL)
    *dropped = atomic_load(&o->dropped);
  pthread_cond_destroy(&o->cv);
  pthread_cond_destroy(&o->drained);
  pthread_mutex_destroy(&o->mu);
  otlp_free(o);
}

/* The public names (agentguard/proxy.h). */
ag_err_t ag_otlp_start(ag_otlp **out, const char *traces_url,
                       const char *headers, const char *service_name,
                       ag_error_t *err) {
  return ag__otlp_start(out, traces_url, headers, service_name, err);
}

bool ag_otlp_push(ag_otlp *o, char *span_json) {
  return ag__otlp_push(o, span_json);
}

unsigned long long ag_otlp_stop(ag_otlp *o, int64_t timeout_ms) {
  if (o == NULL)
    return 0;
  /* the count once the exporter has stopped, read just before it is freed */
  unsigned long long dropped = 0;
  ag__otlp_stop_counted(o, timeout_ms, &dropped);
  return dropped;
}

unsigned long long ag_otlp_exported(const ag_otlp *o) {
  return ag__otlp_exported(o);
}

unsigned long long ag_otlp_dropped(const ag_otlp *o) {
  return ag__otlp_dropped(o);
}

bool ag_otlp_random_id(char *out, size_t bytes) {
  return ag__otlp_random_hex(out, bytes);
}

unsigned long long ag__otlp_exported(const ag__otlp *o) {
  return o != NULL ? atomic_load(&((ag__otlp *)o)->exported) : 0;
}

unsigned long long ag__otlp_dropped(const ag__otlp *o) {
  return o != NULL ? atomic_load(&((ag__otlp *)o)->dropped) : 0;
}
