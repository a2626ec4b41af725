/*
 * src/proxy/metrics.h - what the proxy counts for GET /metrics (Prometheus'
 * text exposition format) and how it answers GET /healthz (docs/proxy.md,
 * "Operating it"). Counters are atomics, bumped where the proxy already
 * decides (ag__px_event) and where a request starts and ends; nothing is
 * locked, nothing allocated on the request path.
 */
#ifndef AG_PROXY_METRICS_H
#define AG_PROXY_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agentguard/core.h"

#include "../wire/wire.h"

#define AG__PX_APIS 8       /* the wire shapes, then "other" */
#define AG__PX_DECISIONS 10 /* see decision_names in metrics.c */
#define AG__PX_BUCKETS 13   /* a histogram's buckets, +Inf last */

/* A histogram of durations (cumulated only when rendered). */
typedef struct ag__px_hist {
  atomic_ullong bucket[AG__PX_BUCKETS];
  atomic_ullong count, sum_us;
} ag__px_hist;

typedef struct ag__px_metrics {
  int64_t started_ms; /* wall clock at start */
  atomic_ullong requests[AG__PX_APIS];
  atomic_ullong decisions[AG__PX_DECISIONS];
  atomic_ullong stops[AG_REASON__COUNT];
  atomic_ullong nudges[AG_REASON__COUNT];
  ag__px_hist duration; /* headers in to the answer's end */
  ag__px_hist upstream; /* the upstream's transfers for a request */
  ag__px_hist added;    /* duration minus upstream: the proxy's own */
  atomic_ullong tokens_in, tokens_out; /* the replies' usage, as read */
  atomic_ullong tokens_saved;          /* estimated: see metrics.c */
  atomic_ullong status[6]; /* answers by status class: 1xx..5xx, other */
  atomic_ullong upstream_failures;   /* transfers that reached no upstream */
  atomic_llong up_ok_ms, up_fail_ms; /* the last of each (mono), for readyz */
} ag__px_metrics;

void ag__px_metrics_init(ag__px_metrics *m, int64_t now_wall_ms);
/* A request whose headers are in, by the API its path serves (NULL:
 * passed through). */
void ag__px_metrics_request(ag__px_metrics *m, const ag__wire *shape);
/* A decision the proxy wrote (or would write) as an event. */
void ag__px_metrics_decision(ag__px_metrics *m, const char *decision,
                             const ag_verdict *v);
/* A transfer the proxy waited for (a guarded request's): whether it
 * reached the upstream, at mono `now`. */
void ag__px_metrics_upstream(ag__px_metrics *m, bool reached, int64_t now);
/* GET /readyz's evidence from the transfers themselves: 0 when the last
 * such transfer reached no upstream, in the last 30 s, and none has
 * reached it since; 1 when one reached it in the last 30 s; -1 when no
 * transfer in the last 30 s says (then the proxy probes: readyz). */
int ag__px_metrics_ready(const ag__px_metrics *m, int64_t now);
/* A request answered: its status, how long it took from its headers and
 * how much of that its upstream transfers took (-1: none), the tokens its
 * reply reported (-1: not seen), and the tokens a stop saved (estimated
 * by the caller; 0: none). */
void ag__px_metrics_done(ag__px_metrics *m, unsigned status, int64_t us,
                         int64_t upstream_us, long long in_tokens,
                         long long out_tokens, unsigned long long saved);
/* The exposition text (malloc'd, *len), with the gauges given; NULL when
 * out of memory. */
char *ag__px_metrics_text(const ag__px_metrics *m, unsigned connections,
                          size_t held_bytes, unsigned streams, bool tracing,
                          unsigned long long spans_exported,
                          unsigned long long spans_dropped, size_t *len);

#endif /* AG_PROXY_METRICS_H */
