/*
 * tests/fuzz/fuzz_stream.c - libFuzzer target for the wire layer's stream
 * and body parsers (src/wire/: the SSE parser, the reply assembler, and
 * every shape's event and response readers, picked from the wire table by
 * the input's first byte).
 * Not built by CMake. From the project root:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined \
 *     -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc tests/fuzz/fuzz_stream.c \
 *     src/wire/[a-z]*.c src/providers/http.c \
 *     src/providers/provider.c src/core/[a-z]*.c src/exec/[a-z]*.c \
 *     $(pkg-config --cflags --libs jansson libcurl libcrypto libpcre2-8) \
 *     -lm -lpthread -o /tmp/fuzz_stream
 *   mkdir -p /tmp/stream_corpus
 *   cp tests/fixtures/openai/[a-z]*.sse tests/fixtures/anthropic/[a-z]*.sse \
 *     tests/fixtures/openai/[a-z]*.json tests/fixtures/anthropic/[a-z]*.json \
 *     /tmp/stream_corpus
 *   /tmp/fuzz_stream -max_total_time=60 -max_len=4096 /tmp/stream_corpus
 *
 * The first input byte picks the format (bit 0) and a split point; the rest
 * is the body. Properties checked on every input:
 *  - feeding the stream in one write or split at any point (and in 1-byte
 *    writes) gives the same outcome: the same error state, text, calls,
 *    finish reason and usage (the parser keeps no state that depends on
 *    where the network cut the bytes);
 *  - a failure always comes with a message;
 *  - the whole-body readers never crash on the same bytes;
 *  - the same bytes, when they are JSON, read as a request's conversation
 *    by the shape's to_chat (the proxy's and the audit's reading): a
 *    refusal always says what is wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct outcome {
  ag_err_t failed;
  bool done;
  char *text;
  size_t text_len;
  int n_calls;
  char calls[4096];
  char finish[32];
  ag_usage usage;
  char msg[512];
} outcome;

typedef struct ctx {
  ag__asm a;
  const ag__wire *w;
} ctx;

static int on_event(void *user, const char *event, const char *d, size_t len,
                    size_t pos) {
  ctx *c = user;
  return c->w->event(&c->a, event, d, len, pos);
}

/* Feeds body in writes of `step` bytes after a first write of `first`. */
static void run(const ag__wire *w, const char *body, size_t len, size_t first,
                size_t step, outcome *o) {
  ctx c;
  ag_provider_error pe;
  memset(&pe, 0, sizeof(pe));
  memset(o, 0, sizeof(*o));
  c.w = w;
  ag__asm_init(&c.a, NULL, NULL, &pe, "fuzz");
  ag__sse s;
  ag__sse_init(&s, on_event, &c);
  ag_err_t why = AG_OK;
  int r = 0;
  size_t off = 0;
  while (off < len && r == 0) {
    size_t n = off == 0 ? first : step;
    if (n == 0 || n > len - off)
      n = len - off;
    r = ag__sse_feed(&s, body + off, n, &why);
    off += n;
  }
  if (r == 0)
    r = ag__sse_finish(&s, &why);
  o->failed = r < 0 ? why : c.a.failed;
  o->done = c.a.done;
  if (o->failed == AG_OK) {
    o->text_len = c.a.text.len;
    o->text = c.a.text.p != NULL ? strdup(c.a.text.p) : NULL;
    for (int i = 0; i < c.a.n_slots; i++) {
      ag__part_call *k = &c.a.calls[i];
      if (!k->used)
        continue;
      o->n_calls++;
      size_t at = strlen(o->calls);
      snprintf(o->calls + at, sizeof(o->calls) - at, "%d|%s|%s|%.*s;", i,
               k->id ? k->id : "", k->name ? k->name : "",
               (int)(k->args.len > 512 ? 512 : k->args.len),
               k->args.p ? k->args.p : "");
    }
    memcpy(o->finish, c.a.finish_reason, sizeof(o->finish));
    o->usage = c.a.usage;
  } else if (o->failed == AG_EPROVIDER && pe.message[0] == '\0') {
    fprintf(stderr, "a failure without a message\n");
    abort();
  }
  snprintf(o->msg, sizeof(o->msg), "%s", pe.message);
  ag__asm_free(&c.a);
  ag__sse_free(&s);
}

static void same(const outcome *a, const outcome *b, const char *how) {
  bool eq =
      a->failed == b->failed && a->n_calls == b->n_calls &&
      strcmp(a->calls, b->calls) == 0 && strcmp(a->finish, b->finish) == 0 &&
      a->usage.prompt_tokens == b->usage.prompt_tokens &&
      a->usage.completion_tokens == b->usage.completion_tokens &&
      a->usage.cached_tokens == b->usage.cached_tokens &&
      a->text_len == b->text_len && (a->text == NULL) == (b->text == NULL) &&
      (a->text == NULL || memcmp(a->text, b->text, a->text_len) == 0);
  if (a->failed == AG_EPROVIDER && b->failed == AG_EPROVIDER)
    eq = eq && strcmp(a->msg, b->msg) == 0;
  if (!eq) {
    fprintf(stderr,
            "split changed the outcome (%s): %d/%d calls %s / %s, "
            "%s / %s\n",
            how, (int)a->failed, (int)b->failed, a->calls, b->calls, a->msg,
            b->msg);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  /* the first byte picks the shape (the wire table's rows) and the split */
  size_t n_shapes = 0;
  while (ag__wire_all[n_shapes] != NULL)
    n_shapes++;
  const ag__wire *w = ag__wire_all[data[0] % n_shapes];
  const char *body = (const char *)data + 1;
  size_t len = size - 1;
  size_t split = len > 0 ? (data[0] >> 2) % (len + 1) : 0;
  outcome whole, halves, bytes;
  run(w, body, len, len, len, &whole);
  run(w, body, len, split, len, &halves);
  run(w, body, len, 1, 1, &bytes);
  same(&whole, &halves, "two writes");
  same(&whole, &bytes, "1-byte writes");
  free(whole.text);
  free(halves.text);
  free(bytes.text);

  /* The whole-body readers on the same bytes. */
  ag__asm a;
  ag_provider_error pe;
  memset(&pe, 0, sizeof(pe));
  ag__asm_init(&a, NULL, NULL, &pe, "fuzz");
  w->response(&a, body, len);
  if (a.failed == AG_EPROVIDER && pe.message[0] == '\0')
    abort();
  ag__asm_free(&a);

  /* The conversation readers on the same bytes. */
  json_t *conv = w->to_chat != NULL ? json_loadb(body, len, 0, NULL) : NULL;
  if (conv != NULL) {
    char emsg[256] = "x";
    json_t *chat = w->to_chat(conv, 0, emsg, sizeof emsg);
    /* NULL with "" is out of memory, which the fuzzer does not make */
    if (chat == NULL && emsg[0] == '\0') {
      fprintf(stderr, "to_chat refused without saying why\n");
      abort();
    }
    json_decref(chat);
    json_decref(conv);
  }
  return 0;
}
