/*
 * src/proxy/hooks.h - the proxy's test hooks: its decision and its stream
 * relay run without a connection, for tests/runtime/test_proxy.c, the fuzz
 * targets (fuzz_proxy, fuzz_relay) and bench/bench_proxy.c. Not API: the
 * program never calls them.
 */
#ifndef AG_PROXY_HOOKS_H
#define AG_PROXY_HOOKS_H

#include <stdbool.h>
#include <stddef.h>

#include "agentguard/proxy.h"

/* ag_proxy_decide through one reading of the body (tests, benchmarks):
 * AG_PROXY_READ_ANY is ag_proxy_decide (the tape first, the jansson tree
 * when the tape leaves the body to it); AG_PROXY_READ_TREE the jansson
 * tree alone; AG_PROXY_READ_TAPE the tape alone, returning -2 (err not
 * set) where it would leave the body to the tree. */
typedef enum ag_proxy_read {
  AG_PROXY_READ_ANY,
  AG_PROXY_READ_TAPE,
  AG_PROXY_READ_TREE
} ag_proxy_read;
int ag_proxy_decide_read(const ag_config *cfg, const char *body, size_t len,
                         bool anthropic, ag_proxy_read how, ag_verdict *v,
                         ag_error_t *err);

/* What the proxy makes of an upstream's stream, without a connection
 * (tests, tests/fuzz/fuzz_relay.c): the bytes of a streamed reply (SSE;
 * Chat Completions, or with `anthropic` Messages) go through the relayed
 * stream's own code - parsed, text checked and passed on, calls held, the
 * end checked and written - arriving in two writes split at `split` (at
 * most `len`), a replayed turn with no history. A nudge at the end is not
 * asked (there is no upstream): the stream ends with the error event a
 * failed second request gives. *out (malloc'd, *out_len bytes, NUL after
 * them) is what the client would read. Returns 0, or -1 when out of
 * memory (*out NULL). `flags`: 0, or AG_PROXY_REPLAY_TREE to read every
 * chunk as a jansson tree - the reference path; by default a chunk that
 * carries only text is read from the tokenizer's tape (docs/proxy.md), and
 * the two must give the same bytes. */
#define AG_PROXY_REPLAY_TREE 1u
int ag_proxy_relay_replay(const ag_config *cfg, bool anthropic,
                          const char *stream, size_t len, size_t split,
                          unsigned flags, char **out, size_t *out_len);

/* What the proxy reads from an upstream's whole reply, Chat Completions
 * or with `anthropic` Messages (tests, tests/fuzz/fuzz_relay.c): *out
 * (malloc'd, NUL-terminated) is a
 * JSON object of the reply read - text, refusal, calls, finish reason,
 * usage - or, for a body that is not such a reply, the 502's status and
 * body. `flags`: 0 reads it as the proxy's loop does (a plain reply from
 * the tokenizer's tape), AG_PROXY_REPLAY_TREE as a jansson tree (the
 * reference); the two must give the same object. Returns 0, or -1 when
 * out of memory. */
int ag_proxy_read_whole(bool anthropic, const char *body, size_t len,
                        unsigned flags, char **out);

#endif /* AG_PROXY_HOOKS_H */
