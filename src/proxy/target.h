/*
 * src/proxy/target.h - a client's request-target, checked and normalised
 * before anything else looks at it (target.c; docs/security.md, "The
 * proxy").
 *
 * The proxy forwards a request to the upstream's origin with the client's
 * path and query: the client may choose the path, never the host. So the
 * request-target must be in origin-form (RFC 9112 section 3.2.1: "/" then a
 * path, then an optional "?query"); anything else - "@host/...",
 * "//host/...", an absolute URL, CONNECT's "host:port", OPTIONS' "*" - is
 * refused (400). The path is then normalised as RFC 3986 section 6.2.2
 * does, plus what common servers do on their own, so that the path the
 * guard matches is the one the upstream will route:
 *   - percent-encoded unreserved characters are decoded ("%63hat" is
 *     "chat", "%2E" is "."), and so is ':' ("%3A": Google's APIs, like
 *     servers that decode a path before routing, read
 *     "models/m%3AgenerateContent" as "models/m:generateContent"); other
 *     escapes get upper-case hex digits;
 *   - an encoded "/" or "\", a NUL or another control character, a "%"
 *     without two hex digits, and any character RFC 3986 does not allow in
 *     a path are refused (a server that decodes "%2F" before routing would
 *     see another path than the guard);
 *   - dot segments are removed ("/v1/./chat", "/v1/x/../chat"), a ".."
 *     above the root is refused, and runs of "/" become one (nginx's
 *     merge_slashes, on by default, routes "/v1//chat" as "/v1/chat").
 * The query is checked (escapes, allowed characters) and kept as sent.
 */
#ifndef AG_PROXY_TARGET_H
#define AG_PROXY_TARGET_H

#include <stdbool.h>
#include <stddef.h>

/* Normalises `target` (NUL-terminated, as the client sent it) into `out`:
 * the path, then "?" and the query if there was one. The result is never
 * longer than the input, so cap = strlen(target) + 1 always fits. Returns
 * true, or false with *why set to a static text saying what is wrong
 * (for the 400's message). */
bool ag__target_normalise(const char *target, char *out, size_t cap,
                          const char **why);

#endif
