/*
 * src/proxy/otlp.h - OpenTelemetry traces over OTLP/HTTP, JSON encoding
 * (docs/proxy.md, "Traces"): one span per guarded request, queued by the
 * request's loop without blocking or any I/O, and posted in batches by a
 * thread of its own with libcurl. The queue is bounded: a span that finds
 * it full is dropped and counted, never waited for.
 */
#ifndef AG_PROXY_OTLP_H
#define AG_PROXY_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agentguard/common.h"

#define AG__OTLP_QUEUE_MAX 4096 /* spans waiting to be sent */
#define AG__OTLP_BATCH_MAX 512  /* spans in one export request */
#define AG__OTLP_SPAN_MAX 8192  /* bytes of one span's JSON */

typedef struct ag__otlp ag__otlp;

/* Starts the exporter: spans go to `url` (the whole traces URL, such as
 * http://collector:4318/v1/traces) with the `headers` given ("name=value"
 * pairs separated by commas, OTEL_EXPORTER_OTLP_HEADERS' form; NULL:
 * none), under the resource `service` (service.name). AG_EINVAL names a
 * bad URL or header; AG_ENOMEM. */
ag_err_t ag__otlp_start(ag__otlp **out, const char *url, const char *headers,
                        const char *service, ag_error_t *err);

/* Queues one span (a JSON object's text, malloc'd: taken in every case).
 * Never blocks on the export; false when the queue was full (dropped). */
bool ag__otlp_push(ag__otlp *o, char *span);

/* Sends what is queued, waiting at most timeout_ms, then stops and frees
 * (NULL: nothing). */
void ag__otlp_stop(ag__otlp *o, int64_t timeout_ms);
/* The same, with the spans dropped over its life in *dropped (may be
 * NULL). */
void ag__otlp_stop_counted(ag__otlp *o, int64_t timeout_ms,
                           unsigned long long *dropped);

/* Spans sent and acknowledged (2xx), and dropped (the queue full, or an
 * export that failed). */
unsigned long long ag__otlp_exported(const ag__otlp *o);
unsigned long long ag__otlp_dropped(const ag__otlp *o);

/* Random ids for a span, as lower-case hex: 16 bytes (trace) or 8 (span).
 * false when the random source failed. */
bool ag__otlp_random_hex(char *out, size_t bytes);

#endif /* AG_PROXY_OTLP_H */
