/*
 * src/proxy/metrics.c - the proxy's counters and their Prometheus text
 * (metrics.h; the series are listed in docs/proxy.md, "Operating it").
 */
#include "metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/internal.h"

/* The decisions of ag__px_event (docs/proxy.md, "Events"); anything else
 * is "other". */
static const char *const decision_names[AG__PX_DECISIONS] = {
    "stopped_before_request",
    "reply_replaced",
    "final_request_without_tools",
    "stream_stopped",
    "nudge",
    "error_context",
    "unguarded",
    "bad_request",
    "bad_request_target",
    "other"};

/* Upper bounds of the buckets, in microseconds: for whole requests and
 * upstream transfers (1 ms to 60 s), and for the time the proxy adds
 * (0.1 ms to 1 s). */
static const int64_t bucket_us[AG__PX_BUCKETS - 1] = {
    1000,   5000,   10000,   25000,   50000,    100000,
    250000, 500000, 1000000, 2500000, 10000000, 60000000};
static const int64_t added_us[AG__PX_BUCKETS - 1] = {
    100,   250,   500,    1000,   2500,   5000,
    10000, 25000, 100000, 250000, 500000, 1000000};

static void observe(ag__px_hist *h, const int64_t bounds[AG__PX_BUCKETS - 1],
                    int64_t us) {
  if (us < 0)
    us = 0;
  size_t b = 0;
  while (b < AG__PX_BUCKETS - 1 && us > bounds[b])
    b++;
  atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum_us, (unsigned long long)us,
                            memory_order_relaxed);
}

void ag__px_metrics_init(ag__px_metrics *m, int64_t now_wall_ms) {
  memset(m, 0, sizeof *m);
  m->started_ms = now_wall_ms;
}

void ag__px_metrics_request(ag__px_metrics *m, const ag__wire *shape) {
  size_t other = 0; /* the index after the shapes */
  while (ag__wire_all[other] != NULL && other < AG__PX_APIS - 1)
    other++;
  size_t i = 0;
  while (i < other && ag__wire_all[i] != shape)
    i++;
  atomic_fetch_add_explicit(&m->requests[i], 1, memory_order_relaxed);
}

void ag__px_metrics_decision(ag__px_metrics *m, const char *decision,
                             const ag_verdict *v) {
  size_t i = 0;
  while (i + 1 < AG__PX_DECISIONS && strcmp(decision_names[i], decision) != 0)
    i++;
  atomic_fetch_add_explicit(&m->decisions[i], 1, memory_order_relaxed);
  if (v == NULL || v->reason <= 0 || v->reason >= AG_REASON__COUNT)
    return;
  atomic_ullong *by = v->action == AG_NUDGE ? m->nudges : m->stops;
  atomic_fetch_add_explicit(&by[v->reason], 1, memory_order_relaxed);
}

void ag__px_metrics_upstream(ag__px_metrics *m, bool reached, int64_t now) {
  if (reached) {
    atomic_store_explicit(&m->up_ok_ms, now, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&m->up_fail_ms, now, memory_order_relaxed);
  atomic_fetch_add_explicit(&m->upstream_failures, 1, memory_order_relaxed);
}

int ag__px_metrics_ready(const ag__px_metrics *m, int64_t now) {
  long long ok = atomic_load_explicit(&m->up_ok_ms, memory_order_relaxed);
  long long fail = atomic_load_explicit(&m->up_fail_ms, memory_order_relaxed);
  if (fail != 0 && fail > ok && now - fail <= 30000)
    return 0;
  return ok != 0 && now - ok <= 30000 ? 1 : -1;
}

void ag__px_metrics_done(ag__px_metrics *m, unsigned status, int64_t us,
                         int64_t upstream_us, long long in_tokens,
                         long long out_tokens, unsigned long long saved) {
  unsigned cls = status >= 100 && status < 600 ? status / 100 - 1 : 5;
  atomic_fetch_add_explicit(&m->status[cls], 1, memory_order_relaxed);
  observe(&m->duration, bucket_us, us);
  if (upstream_us >= 0) {
    observe(&m->upstream, bucket_us, upstream_us);
    observe(&m->added, added_us, us - upstream_us);
  }
  if (in_tokens > 0)
    atomic_fetch_add_explicit(&m->tokens_in, (unsigned long long)in_tokens,
                              memory_order_relaxed);
  if (out_tokens > 0)
    atomic_fetch_add_explicit(&m->tokens_out, (unsigned long long)out_tokens,
                              memory_order_relaxed);
  if (saved > 0)
    atomic_fetch_add_explicit(&m->tokens_saved, saved, memory_order_relaxed);
}

static unsigned long long get(const atomic_ullong *a) {
  return atomic_load_explicit(a, memory_order_relaxed);
}

static void head(ag__buf *b, const char *name, const char *type,
                 const char *help) {
  ag__buf_printf_cut(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void api_series(ag__buf *b, const ag__px_metrics *m) {
  head(b, "agentguard_proxy_requests_total", "counter",
       "Requests received, by the API their path serves (other: passed "
       "through unguarded).");
  size_t n = 0;
  for (; ag__wire_all[n] != NULL && n < AG__PX_APIS - 1; n++)
    ag__buf_printf_cut(b, "agentguard_proxy_requests_total{api=\"%s\"} %llu\n",
                       ag__wire_all[n]->name, get(&m->requests[n]));
  ag__buf_printf_cut(b, "agentguard_proxy_requests_total{api=\"other\"} %llu\n",
                     get(&m->requests[n]));
}

static void reason_series(ag__buf *b, const char *name, const char *help,
                          const atomic_ullong *by) {
  head(b, name, "counter", help);
  for (int r = 1; r < AG_REASON__COUNT; r++)
    ag__buf_printf_cut(b, "%s{reason=\"%s\"} %llu\n", name,
                       ag_reason_name((ag_reason)r), get(&by[r]));
}

static void hist_series(ag__buf *b, const char *name, const char *help,
                        const ag__px_hist *h,
                        const int64_t bounds[AG__PX_BUCKETS - 1]) {
  head(b, name, "histogram", help);
  unsigned long long cum = 0;
  for (size_t i = 0; i < AG__PX_BUCKETS; i++) {
    cum += get(&h->bucket[i]);
    if (i + 1 < AG__PX_BUCKETS)
      ag__buf_printf_cut(b, "%s_bucket{le=\"%g\"} %llu\n", name,
                         (double)bounds[i] / 1e6, cum);
    else
      ag__buf_printf_cut(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
  }
  ag__buf_printf_cut(b, "%s_sum %.6f\n", name, (double)get(&h->sum_us) / 1e6);
  ag__buf_printf_cut(b, "%s_count %llu\n", name, get(&h->count));
}

static void token_series(ag__buf *b, const ag__px_metrics *m) {
  head(b, "agentguard_proxy_tokens_total", "counter",
       "Tokens the upstream's replies reported (usage), as the proxy read "
       "them.");
  ag__buf_printf_cut(b, "agentguard_proxy_tokens_total{kind=\"input\"} %llu\n",
                     get(&m->tokens_in));
  ag__buf_printf_cut(b, "agentguard_proxy_tokens_total{kind=\"output\"} %llu\n",
                     get(&m->tokens_out));
  head(b, "agentguard_proxy_tokens_saved_estimate_total", "counter",
       "Input tokens of the requests stopped before going upstream, "
       "estimated as their body's bytes / 4.");
  ag__buf_printf_cut(b, "agentguard_proxy_tokens_saved_estimate_total %llu\n",
                     get(&m->tokens_saved));
}

char *ag__px_metrics_text(const ag__px_metrics *m, unsigned connections,
                          size_t held_bytes, unsigned streams, bool tracing,
                          unsigned long long spans_exported,
                          unsigned long long spans_dropped, size_t *len) {
  ag__buf b;
  ag__buf_init(&b, 256u << 10);
  head(&b, "agentguard_proxy_info", "gauge", "The proxy's version (always 1).");
  ag__buf_printf_cut(&b, "agentguard_proxy_info{version=\"%s\"} 1\n",
                     ag_version());
  head(&b, "agentguard_proxy_start_time_seconds", "gauge",
       "When the proxy started, in seconds since the epoch.");
  ag__buf_printf_cut(&b, "agentguard_proxy_start_time_seconds %lld\n",
                     (long long)(m->started_ms / 1000));
  api_series(&b, m);
  head(&b, "agentguard_proxy_decisions_total", "counter",
       "Decisions other than letting a request through, by decision (the "
       "events' names).");
  for (size_t i = 0; i < AG__PX_DECISIONS; i++)
    ag__buf_printf_cut(&b,
                       "agentguard_proxy_decisions_total{decision=\"%s\"} "
                       "%llu\n",
                       decision_names[i], get(&m->decisions[i]));
  reason_series(&b, "agentguard_proxy_stops_total",
                "Turns stopped or escalated, by the mechanism's reason.",
                m->stops);
  reason_series(&b, "agentguard_proxy_nudges_total",
                "Calls held back with a nudge, by the mechanism's reason.",
                m->nudges);
  head(&b, "agentguard_proxy_responses_total", "counter",
       "Answers sent, by status class.");
  static const char *const cls[6] = {"1xx", "2xx", "3xx",
                                     "4xx", "5xx", "other"};
  for (size_t i = 0; i < 6; i++)
    ag__buf_printf_cut(&b,
                       "agentguard_proxy_responses_total{code=\"%s\"} %llu\n",
                       cls[i], get(&m->status[i]));
  hist_series(&b, "agentguard_proxy_request_duration_seconds",
              "Time from a request's headers to the end of its answer.",
              &m->duration, bucket_us);
  hist_series(&b, "agentguard_proxy_upstream_duration_seconds",
              "Time a request's upstream transfers took (for requests that "
              "made one).",
              &m->upstream, bucket_us);
  hist_series(&b, "agentguard_proxy_added_latency_seconds",
              "A request's time minus its upstream transfers': what the "
              "proxy added (for requests that made one).",
              &m->added, added_us);
  token_series(&b, m);
  head(&b, "agentguard_proxy_upstream_failures_total", "counter",
       "Transfers for guarded requests that reached no upstream (DNS, "
       "connect, TLS, timeout).");
  ag__buf_printf_cut(&b, "agentguard_proxy_upstream_failures_total %llu\n",
                     get(&m->upstream_failures));
  head(&b, "agentguard_proxy_open_connections", "gauge",
       "Client connections open.");
  ag__buf_printf_cut(&b, "agentguard_proxy_open_connections %u\n", connections);
  head(&b, "agentguard_proxy_open_streams", "gauge",
       "Responses relayed as they come (streams and passed-through "
       "bodies), open now.");
  ag__buf_printf_cut(&b, "agentguard_proxy_open_streams %u\n", streams);
  head(&b, "agentguard_proxy_held_bytes", "gauge",
       "Bytes of replies held whole under --max-buffered.");
  ag__buf_printf_cut(&b, "agentguard_proxy_held_bytes %zu\n", held_bytes);
  if (tracing) {
    head(&b, "agentguard_proxy_spans_exported_total", "counter",
         "Spans the OTLP collector took.");
    ag__buf_printf_cut(&b, "agentguard_proxy_spans_exported_total %llu\n",
                       spans_exported);
    head(&b, "agentguard_proxy_spans_dropped_total", "counter",
         "Spans dropped: the export queue was full, or the export failed.");
    ag__buf_printf_cut(&b, "agentguard_proxy_spans_dropped_total %llu\n",
                       spans_dropped);
  }
  if (b.cut || b.p == NULL) {
    ag__buf_free(&b);
    return NULL;
  }
  *len = b.len;
  return b.p;
}
