/*
 * bench/bench_provider.c - the HTTP providers' own cost, without the
 * network: building a request body from a 200-message (~64 KiB) history,
 * and parsing a 100-chunk streamed reply (SSE framing, JSON of each chunk,
 * text deltas and tool call fragments assembled into an ag_reply). Both
 * wire formats. Also the memory a request holds: the body text, and the
 * parser's and assembler's buffers after the 100-chunk reply, plus the heap
 * a provider holds between requests (its libcurl handles).
 *
 * Prints figures; never fails on speed. Each time is the median of 9 runs
 * of many repetitions. Target (issue 11): build + parse under 1 ms.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agentguard.h"
#include "providers/internal.h"

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

/* 200 messages: a system prompt, then rounds of user / assistant with a
 * tool call / tool result, ~320 bytes of text each. */
static json_t *make_history(size_t *bytes) {
  json_t *h = json_array();
  char text[400];
  json_array_append_new(
      h, json_pack("{s:s, s:s}", "role", "system", "content",
                   "You are a careful coding agent. Use the tools."));
  for (int i = 1; json_array_size(h) < 200; i++) {
    snprintf(text, sizeof(text),
             "Step %d: the build failed in src/module_%d.c with \"expected "
             "';' before '}' token\" at line %d; please read the file, find "
             "the missing semicolon and fix it, then run the tests again and "
             "report what changed, including any warnings the compiler "
             "printed about unused variables or implicit declarations. "
             "Ünïcödé ☕ too.",
             i, i, i * 7);
    int k = (int)json_array_size(h) % 3;
    if (k == 1) {
      json_array_append_new(
          h, json_pack("{s:s, s:s}", "role", "user", "content", text));
    } else if (k == 2) {
      char id[32], args[160];
      snprintf(id, sizeof(id), "call_%d", i);
      snprintf(args, sizeof(args),
               "{\"path\": \"src/module_%d.c\", \"start\": %d, \"end\": %d}", i,
               i, i + 40);
      json_array_append_new(
          h, json_pack("{s:s, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role",
                       "assistant", "content", "Reading the file.",
                       "tool_calls", "id", id, "type", "function", "function",
                       "name", "read_file", "arguments", args));
    } else {
      char id[32];
      snprintf(id, sizeof(id), "call_%d", i - 1);
      json_array_append_new(h, json_pack("{s:s, s:s, s:s}", "role", "tool",
                                         "tool_call_id", id, "content", text));
    }
  }
  char *d = json_dumps(h, JSON_COMPACT);
  *bytes = strlen(d);
  free(d);
  return h;
}

static json_t *make_tools(void) {
  json_t *t = json_array();
  static const char *const names[] = {"read_file",   "write_file",
                                      "edit_file",   "list_dir",
                                      "search_text", "run_command"};
  for (size_t i = 0; i < 6; i++)
    json_array_append_new(
        t, json_pack("{s:s, s:{s:s, s:s, s:{s:s, s:{s:{s:s}}, s:[s]}}}", "type",
                     "function", "function", "name", names[i], "description",
                     "A built-in tool of agentguard run.", "parameters", "type",
                     "object", "properties", "path", "type", "string",
                     "required", "path"));
  return t;
}

/* 100 chunks: 90 text deltas of ~12 bytes, then two tool calls in
 * fragments, the finish chunk and the usage chunk. */
static char *make_openai_stream(size_t *len) {
  size_t cap = 64 * 1024, n = 0;
  char *s = malloc(cap);
  static const char head[] =
      "data: {\"id\":\"chatcmpl-B1\",\"object\":\"chat.completion.chunk\","
      "\"created\":1732000000,\"model\":\"gpt-4o-mini\",\"choices\":[{"
      "\"index\":0,\"delta\":";
  static const char tail[] = ",\"logprobs\":null,\"finish_reason\":null}]}\n\n";
  for (int i = 0; i < 90; i++)
    n += (size_t)snprintf(s + n, cap - n, "%s{\"content\":\"word %02d é, \"}%s",
                          head, i, tail);
  static const char *const frags[] = {
      "{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\","
      "\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]}",
      "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"pa\"}}]"
      "}",
      "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"th\\\": "
      "\\\"a.c\\\"}\"}}]}",
      "{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\","
      "\"function\":{\"name\":\"list_dir\",\"arguments\":\"\"}}]}",
      "{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"{\\\"path\"}"
      "}]}",
      "{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"\\\": "
      "\\\"src\\\"\"}}]}",
      "{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"}\"}}]}",
  };
  for (size_t i = 0; i < 7; i++)
    n += (size_t)snprintf(s + n, cap - n, "%s%s%s", head, frags[i], tail);
  n +=
      (size_t)snprintf(s + n, cap - n,
                       "%s{},\"logprobs\":null,\"finish_reason\":\"tool_calls\""
                       "}]}\n\n",
                       head);
  n += (size_t)snprintf(
      s + n, cap - n,
      "data: {\"id\":\"chatcmpl-B1\",\"object\":\"chat.completion.chunk\","
      "\"created\":1732000000,\"model\":\"gpt-4o-mini\",\"choices\":[],"
      "\"usage\":{\"prompt_tokens\":16000,\"completion_tokens\":300,"
      "\"total_tokens\":16300}}\n\n");
  n += (size_t)snprintf(s + n, cap - n, "data: [DONE]\n\n");
  *len = n;
  return s;
}

static char *make_anthropic_stream(size_t *len) {
  size_t cap = 64 * 1024, n = 0;
  char *s = malloc(cap);
  n += (size_t)snprintf(
      s + n, cap - n,
      "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{"
      "\"id\":\"msg_1\",\"usage\":{\"input_tokens\":16000,\"output_tokens\":1}"
      "}}\n\nevent: content_block_start\ndata: {\"type\":"
      "\"content_block_start\",\"index\":0,\"content_block\":{\"type\":"
      "\"text\",\"text\":\"\"}}\n\n");
  for (int i = 0; i < 90; i++)
    n += (size_t)snprintf(
        s + n, cap - n,
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
        "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"word %02d "
        "é, \"}}\n\n",
        i);
  n += (size_t)snprintf(
      s + n, cap - n,
      "event: content_block_start\ndata: {\"type\":\"content_block_start\","
      "\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":"
      "\"toolu_1\",\"name\":\"read_file\",\"input\":{}}}\n\n");
  static const char *const parts[] = {"{\\\"pa", "th\\\": ", "\\\"a.c\\\"}"};
  for (int i = 0; i < 3; i++)
    n += (size_t)snprintf(
        s + n, cap - n,
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
        "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
        "\"partial_json\":\"%s\"}}\n\n",
        parts[i]);
  n += (size_t)snprintf(
      s + n, cap - n,
      "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{"
      "\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":300}}\n\n"
      "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
  *len = n;
  return s;
}

typedef struct run {
  ag__asm a;
  bool openai;
} run;

static int on_event(void *user, const char *event, const char *data, size_t len,
                    size_t pos) {
  run *r = user;
  return r->openai ? ag__openai_event(&r->a, event, data, len, pos)
                   : ag__anthropic_event(&r->a, event, data, len, pos);
}

static int count_delta(void *user, const char *t, size_t n) {
  (void)t;
  *(size_t *)user += n;
  return 0;
}

/* Parses the stream in 512-byte reads (as curl would hand it over). */
static size_t parse_stream(bool openai, const char *s, size_t len,
                           size_t *mem) {
  run r;
  r.openai = openai;
  size_t seen = 0;
  ag_provider_error pe;
  memset(&pe, 0, sizeof(pe));
  ag__asm_init(&r.a, count_delta, &seen, &pe, "bench");
  ag__sse sse;
  ag__sse_init(&sse, on_event, &r);
  ag_err_t why;
  for (size_t off = 0; off < len; off += 512) {
    size_t n = len - off < 512 ? len - off : 512;
    if (ag__sse_feed(&sse, s + off, n, &why) != 0) {
      fprintf(stderr, "bench_provider: the stream did not parse: %s\n",
              pe.message);
      exit(1);
    }
  }
  ag__sse_finish(&sse, &why);
  ag_reply reply;
  memset(&reply, 0, sizeof(reply));
  if (!r.a.done || ag__asm_finish(&r.a, &reply) != AG_OK ||
      reply.n_calls == 0) {
    fprintf(stderr, "bench_provider: the reply is incomplete\n");
    exit(1);
  }
  if (mem != NULL) {
    *mem = sse.line.alloc + sse.data.alloc + r.a.text.alloc;
    for (int i = 0; i < r.a.n_slots; i++)
      *mem += r.a.calls[i].args.alloc;
  }
  size_t calls = reply.n_calls;
  ag_reply_clear(&reply);
  ag__asm_free(&r.a);
  ag__sse_free(&sse);
  return calls + seen;
}

#define ROUNDS 9

static double median_us(double *v) {
  qsort(v, ROUNDS, sizeof(double), cmp_d);
  return v[ROUNDS / 2];
}

static void bench_kind(bool openai, const json_t *hist, const json_t *tools) {
  const char *kind = openai ? "openai" : "anthropic";
  ag__wire_opts o = {"model-x", true, -1, 0, true, NULL};
  ag_request req = {hist, tools, 1, 1, NULL, 0};
  size_t stream_len;
  char *stream = openai ? make_openai_stream(&stream_len)
                        : make_anthropic_stream(&stream_len);
  double build[ROUNDS], parse[ROUNDS];
  size_t body_len = 0, parse_mem = 0, sink = 0;
  const int reps = 200;
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < reps; i++) {
      ag_err_t rc;
      char msg[128];
      char *b = openai ? ag__openai_request(&o, &req, &body_len, &rc, msg,
                                            sizeof(msg))
                       : ag__anthropic_request(&o, &req, &body_len, &rc, msg,
                                               sizeof(msg));
      if (b == NULL) {
        fprintf(stderr, "bench_provider: request failed (%d)\n", (int)rc);
        exit(1);
      }
      free(b);
    }
    build[r] = (now_ns() - t0) / reps / 1000.0;
    t0 = now_ns();
    for (int i = 0; i < reps; i++)
      sink +=
          parse_stream(openai, stream, stream_len, i == 0 ? &parse_mem : NULL);
    parse[r] = (now_ns() - t0) / reps / 1000.0;
  }
  double b = median_us(build), p = median_us(parse);
  printf("%-9s build %7.1f us (%zu-byte body)  parse 100 chunks %6.1f us "
         "(%zu bytes)  together %7.1f us  %s\n",
         kind, b, body_len, p, stream_len, b + p,
         b + p < 1000 ? "(target < 1 ms: met)" : "(target < 1 ms: NOT met)");
  printf("%-9s memory per request: body %zu B, stream parser + assembler "
         "buffers %zu B (freed when the request ends)\n",
         kind, body_len, parse_mem);
  printf("provider_build_us kind=%s value=%.1f\n", kind, b);
  printf("provider_parse_us kind=%s value=%.1f\n", kind, p);
  if (sink == 0)
    printf("(nothing parsed)\n");
  free(stream);
}

int main(void) {
  size_t hist_bytes;
  json_t *hist = make_history(&hist_bytes);
  json_t *tools = make_tools();
  printf("history: %zu messages, %zu bytes as JSON; %zu tools\n",
         json_array_size(hist), hist_bytes, json_array_size(tools));
  bench_kind(true, hist, tools);
  bench_kind(false, hist, tools);

  /* What a provider holds between requests. */
  setenv("BENCH_NO_KEY", "", 1);
  ag_http_provider_opts o;
  ag_http_provider_opts_init(&o);
  o.model = "m";
  o.base_url = "http://127.0.0.1:9/v1";
  o.api_key_env = "BENCH_NO_KEY";
  ag_provider *warm = NULL;
  ag_provider_http_new(&warm, &o, NULL); /* curl's global state, once */
  size_t before = heap_in_use();
  ag_provider *p = NULL;
  if (ag_provider_http_new(&p, &o, NULL) != AG_OK) {
    fprintf(stderr, "bench_provider: ag_provider_http_new failed\n");
    return 1;
  }
  size_t held = heap_in_use() - before;
  printf("a provider holds %zu B of heap between requests (libcurl easy + "
         "multi handles, headers, options)\n",
         held);
  ag_provider_free(p);
  ag_provider_free(warm);
  json_decref(hist);
  json_decref(tools);
  return 0;
}
