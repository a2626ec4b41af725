/*
 * src/providers/internal.h - what the providers share (ag__ prefix). Not
 * installed, not API.
 *
 * Layers: providers depend on base, core, the agent's model interface
 * (include/agentguard/providers.h) and the wire layer (src/wire/: the API
 * shapes, the SSE parser, the reply assembler). libcurl is used here and
 * in the proxy (src/proxy/), each for its own transfers.
 *
 *   http.c      the HTTP provider object: a libcurl transfer with
 *               cancellation, timeouts and caps, status and error-body
 *               rules, Retry-After; the shape's table (src/wire/) builds
 *               the request and reads the reply
 *   provider.c  the provider interface's generic half
 *   scripted.c  the scripted model of scenarios
 *   config.c    the "provider" section of a config file
 */
#ifndef AG_PROVIDERS_INTERNAL_H
#define AG_PROVIDERS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "agentguard/providers.h"

#include "../base/internal.h"
#include "../wire/wire.h"

#endif /* AG_PROVIDERS_INTERNAL_H */
