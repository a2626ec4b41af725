/*
 * tests/fuzz/fuzz_relay.c - libFuzzer target for what the proxy does to an
 * upstream's streamed reply (ag_proxy_relay_replay, src/proxy/stream.c: the
 * relayed stream's event handlers, the held calls, the end's check and
 * the blocks renumbered for an Anthropic client). The upstream is the
 * other party the proxy cannot trust: an input it chokes on takes down
 * every client's stream (one did: a held event's unchecked "index").
 *
 * Input: the first byte chooses the API shape (bit 0: Anthropic Messages,
 * else Chat Completions) and the preset (bits 1-2: default, forge, hpd,
 * twelve-factor); the second byte where the stream is split in two writes
 * (its value times the rest's length over 256); the rest is the stream.
 *
 * Properties checked on every input:
 *  - the client's bytes are the same whether the stream came in one write
 *    or in two (where the network cuts the bytes changes nothing), but
 *    for the "created" second of the chunks the proxy writes itself;
 *  - they are the same whether a chunk that carries only text is read
 *    from the tokenizer's tape (the proxy's way) or, as every other chunk,
 *    as a jansson tree (AG_PROXY_REPLAY_TREE: the reference);
 *  - read as a whole reply of the same API instead, the bytes give the
 *    same reply, or the same 502, from the tape
 *    (ag_proxy_read_whole, the proxy's loop) as from a jansson tree;
 *  - they are whole SSE events: Chat Completions, "data:" lines then a
 *    blank line, their data [DONE] or JSON, the last event [DONE] or an
 *    error object; Messages, "event: NAME", "data:" lines of JSON, a blank
 *    line, every event. Data of several lines goes as several "data:"
 *    lines (one line holding a line break would end the event early); JSON
 *    is an object, or an array: an event whose data has no "type" is
 *    passed on as the upstream sent it (a newer kind of event).
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agentguard.h"
#include "agentguard/proxy.h"
#include "proxy/hooks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const presets[4] = {"default", "forge", "hpd",
                                       "twelve-factor"};
static ag_config cfgs[4];
static int ready;

static void check(int ok, const char *what, const char *detail) {
  if (!ok) {
    fprintf(stderr, "fuzz_relay: property failed: %s%s%.300s\n", what,
            detail != NULL ? ": " : "", detail != NULL ? detail : "");
    abort();
  }
}

/* Whether b[0..n) is one JSON object or array. */
static int is_json(const char *b, size_t n) {
  json_t *j = json_loadb(b, n, 0, NULL);
  int ok = j != NULL;
  json_decref(j);
  return ok;
}

/* The client's bytes as whole events of their shape: an "event: NAME"
 * line (Messages), one or more "data: " lines (their text joined with
 * "\n" is the event's data, as a client's SSE reader joins them), a blank
 * line. */
static void check_events(const char *out, size_t len, int anthropic) {
  const char *p = out, *end = out + len;
  int last_done = 0, last_error = 0, events = 0;
  char *data = malloc(len + 1);
  check(data != NULL, "memory for the check", NULL);
  while (p < end) {
    if (anthropic) {
      check(end - p > 7 && memcmp(p, "event: ", 7) == 0,
            "an event starts with its name", p);
      const char *nl = memchr(p, '\n', (size_t)(end - p));
      check(nl != NULL, "the name line ends", p);
      p = nl + 1;
    }
    size_t n = 0;
    int lines = 0;
    while (end - p > 6 && memcmp(p, "data: ", 6) == 0) {
      const char *nl = memchr(p + 6, '\n', (size_t)(end - p - 6));
      check(nl != NULL, "a data line ends", p);
      if (lines++ > 0)
        data[n++] = '\n';
      memcpy(data + n, p + 6, (size_t)(nl - p - 6));
      n += (size_t)(nl - p - 6);
      p = nl + 1;
    }
    check(lines > 0, "an event has its data", p);
    check(p < end && *p == '\n', "an event ends with a blank line", p);
    p++;
    data[n] = '\0';
    last_done = !anthropic && n == 6 && memcmp(data, "[DONE]", 6) == 0;
    check(last_done || is_json(data, n), "an event's data is JSON", data);
    last_error = !last_done && n > 9 && memcmp(data, "{\"error\":", 9) == 0;
    events++;
  }
  free(data);
  if (!anthropic)
    check(events > 0 && (last_done || last_error),
          "a Chat Completions stream ends with [DONE] or an error", out);
}

/* The digits after every "created": set to 0: the chunks the proxy writes
 * itself (a stop's) carry the second they were made in, which two
 * replays may not share. */
static void no_clock(char *b, size_t n) {
  static const char key[] = "\"created\":";
  char *end = b + n, *k = b;
  while ((k = memmem(k, (size_t)(end - k), key, sizeof key - 1)) != NULL)
    for (k += sizeof key - 1; k < end && *k >= '0' && *k <= '9'; k++)
      *k = '0';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) {
    for (int i = 0; i < 4; i++)
      if (ag_config_preset(&cfgs[i], presets[i], NULL) != AG_OK)
        abort();
    ready = 1;
  }
  if (size < 2)
    return 0;
  int anthropic = data[0] & 1;
  const ag_config *cfg = &cfgs[(data[0] >> 1) & 3];
  const char *s = (const char *)data + 2;
  size_t len = size - 2;
  size_t split = (size_t)data[1] * len / 256;
  char *whole = NULL, *cut = NULL, *tree = NULL;
  size_t wl = 0, cl = 0, tl = 0;
  if (ag_proxy_relay_replay(cfg, anthropic, s, len, 0, 0, &whole, &wl) != 0 ||
      ag_proxy_relay_replay(cfg, anthropic, s, len, split, 0, &cut, &cl) != 0 ||
      ag_proxy_relay_replay(cfg, anthropic, s, len, split, AG_PROXY_REPLAY_TREE,
                            &tree, &tl) != 0) {
    free(whole);
    free(cut);
    free(tree);
    return 0; /* out of memory: not a property */
  }
  check_events(whole, wl, anthropic);
  no_clock(whole, wl);
  no_clock(cut, cl);
  no_clock(tree, tl);
  check(wl == cl && memcmp(whole, cut, wl) == 0,
        "the same bytes in one write or two", whole);
  check(cl == tl && memcmp(cut, tree, cl) == 0,
        "the same bytes with text chunks read from the tape or as trees", cut);
  free(whole);
  free(cut);
  free(tree);
  /* the same bytes as a whole reply of the same API, both ways */
  char *w_tape = NULL, *w_tree = NULL;
  if (ag_proxy_read_whole(anthropic, s, len, 0, &w_tape) == 0 &&
      ag_proxy_read_whole(anthropic, s, len, AG_PROXY_REPLAY_TREE, &w_tree) ==
          0)
    check(strcmp(w_tape, w_tree) == 0,
          "the same whole reply read from the tape or as a tree", w_tape);
  free(w_tape);
  free(w_tree);
  return 0;
}
