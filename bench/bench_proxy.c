/*
 * bench_proxy.c - the proxy's decision before forwarding, for a request
 * whose turn carries a long history (docs/benchmarks.md, docs/proxy.md):
 * read the body (the JCS tokenizer's tape), take the turn, replay it
 * through a fresh guard, count the coming request (ag_proxy_decide, the
 * same code a served request runs). Target: under 1 ms for 500 messages.
 * Also timed: the same decision through the jansson tree alone
 * (AG_PROXY_READ_TREE, the path before the tape and the fallback now), and
 * the floor of that path, json_loadb of the body.
 *
 *   build/bench_proxy [MESSAGES]   (default 500)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "agentguard.h"
#include "agentguard/proxy.h"
#include "proxy/hooks.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* This thread's CPU time: unlike the wall clock, not stretched by the other
 * processes of a shared machine (docs/benchmarks.md gives both). */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A user message, then rounds of read_file(path_i) and its result until
 * `n` messages: the whole history is one turn (the worst case). */
static char *history(int n, bool anthropic) {
  json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content",
                           "Read every file and summarise the project.");
  for (int i = 0; (int)json_array_size(msgs) + 2 <= n; i++) {
    char id[32], args[64], result[160];
    snprintf(id, sizeof id, "call_%d", i);
    snprintf(args, sizeof args, "{\"path\":\"src/file_%d.c\"}", i);
    snprintf(result, sizeof result,
             "/* file %d */\nint f%d(void) { return %d; }\n"
             "/* a short result of a few dozen bytes */",
             i, i, i);
    if (anthropic) {
      json_array_append_new(msgs,
                            json_pack("{s:s, s:[{s:s, s:s, s:s, s:o}]}", "role",
                                      "assistant", "content", "type",
                                      "tool_use", "id", id, "name", "read_file",
                                      "input", json_loads(args, 0, NULL)));
      json_array_append_new(msgs,
                            json_pack("{s:s, s:[{s:s, s:s, s:s}]}", "role",
                                      "user", "content", "type", "tool_result",
                                      "tool_use_id", id, "content", result));
    } else {
      json_array_append_new(
          msgs, json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role",
                          "assistant", "content", "tool_calls", "id", id,
                          "type", "function", "function", "name", "read_file",
                          "arguments", args));
      json_array_append_new(msgs,
                            json_pack("{s:s, s:s, s:s}", "role", "tool",
                                      "tool_call_id", id, "content", result));
    }
  }
  json_t *o = json_pack("{s:s, s:o}", "model", "m", "messages", msgs);
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 500;
  if (n < 3) {
    fprintf(stderr, "usage: bench_proxy [MESSAGES >= 3]\n");
    return 2;
  }
  ag_config cfg;
  ag_config_preset(&cfg, "default", NULL);
  cfg.loop.max_iterations = 0; /* the whole history replays */
  for (int anth = 0; anth <= 1; anth++) {
    char *body = history(n, anth);
    size_t len = strlen(body);
    ag_verdict v;
    ag_error_t err;
    int act = ag_proxy_decide(&cfg, body, len, anth, &v, &err);
    if (ag_proxy_decide_read(&cfg, body, len, anth, AG_PROXY_READ_TAPE, &v,
                             &err) != act) {
      fprintf(stderr, "bench_proxy: the tape did not decide the request\n");
      free(body);
      return 1;
    }
    if (act != AG_ALLOW) {
      fprintf(stderr, "bench_proxy: unexpected decision %d: %s %s\n", act,
              act < 0 ? err.msg : ag_reason_name(v.reason), v.message);
      free(body);
      return 1;
    }
    int reps = 0;
    double t0 = now_s(), c0 = cpu_s(), t;
    do {
      ag_proxy_decide(&cfg, body, len, anth, &v, &err);
      reps++;
      t = now_s();
    } while (t - t0 < 1.0);
    double c = cpu_s();
    printf("proxy decision (%s, %d messages, %zu bytes): %.3f ms per request "
           "(%d runs), %.3f ms of CPU\n",
           anth ? "anthropic" : "openai", n, len, (t - t0) * 1e3 / reps, reps,
           (c - c0) * 1e3 / reps);
    reps = 0;
    t0 = now_s();
    c0 = cpu_s();
    do {
      ag_proxy_decide_read(&cfg, body, len, anth, AG_PROXY_READ_TREE, &v, &err);
      reps++;
      t = now_s();
    } while (t - t0 < 1.0);
    c = cpu_s();
    printf("  the same through the jansson tree alone: %.3f ms, %.3f ms of "
           "CPU\n",
           (t - t0) * 1e3 / reps, (c - c0) * 1e3 / reps);
    /* the floor: jansson reading the same body once, nothing else */
    reps = 0;
    t0 = now_s();
    c0 = cpu_s();
    do {
      json_decref(json_loadb(body, len, 0, NULL));
      reps++;
      t = now_s();
    } while (t - t0 < 1.0);
    c = cpu_s();
    printf("  of which the floor, json_loadb of the body alone: %.3f ms, "
           "%.3f ms of CPU\n",
           (t - t0) * 1e3 / reps, (c - c0) * 1e3 / reps);
    free(body);
  }
  return 0;
}
