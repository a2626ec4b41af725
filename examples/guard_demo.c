/*
 * examples/guard_demo.c - the guard alone, through the public C API: four
 * scripted agents run through the `default` preset; the program prints each
 * iteration, what the guard decided, and why it stopped the ones that
 * stopped making progress. Built as build/agentguard-demo. (`make demo` runs
 * the whole loop through `agentguard simulate` instead.)
 */
#include <stdio.h>
#include <string.h>

#include "agentguard.h"

typedef struct demo_call {
  const char *name, *args, *result;
  int failed; /* the tool reported failure */
} demo_call;

typedef struct demo_agent {
  const char *title;
  const char *config; /* JSON on top of the default preset, or NULL */
  int iterations;
  /* calls of iteration i are script[i % period][0..width) */
  int period, width;
  demo_call script[4][2];
} demo_agent;

static const demo_agent agents[] = {
    {"an agent retrying a file that does not exist",
     NULL,
     10,
     1,
     1,
     {{{"read_file", "{\"path\": \"config.yaml\"}",
        "Error: [Errno 2] No such file or directory: 'config.yaml'", 0}}}},
    {"an agent bouncing between two calls (A-B-A-B)",
     NULL,
     12,
     2,
     1,
     {{{"search", "{\"query\": \"timeout setting\"}", "3 matches in docs/", 0}},
      {{"open", "{\"path\": \"docs/setup.md\", \"line\": 12}", "timeout: 30s",
        0}}}},
    {"an agent spamming one call inside parallel batches",
     NULL,
     8,
     4,
     2,
     {{{"read_file", "{\"path\": \"a.c\"}", "...", 0},
       {"git_status", "{}", "clean", 0}},
      {{"read_file", "{\"path\": \"b.c\"}", "...", 0},
       {"git_status", "{}", "clean", 0}},
      {{"read_file", "{\"path\": \"c.c\"}", "...", 0},
       {"git_status", "{}", "clean", 0}},
      {{"read_file", "{\"path\": \"d.c\"}", "...", 0},
       {"git_status", "{}", "clean", 0}}}},
    {"the first agent again, with nudge_before_stop (two strikes)",
     "{\"loop\": {\"nudge_before_stop\": true}, "
     "\"errors\": {\"max_consecutive_errors\": 0}}",
     10,
     1,
     1,
     {{{"read_file", "{\"path\": \"config.yaml\"}",
        "Error: [Errno 2] No such file or directory: 'config.yaml'", 0}}}},
};

static const char *action_name(ag_action a) {
  switch (a) {
  case AG_ALLOW:
    return "allow";
  case AG_NUDGE:
    return "nudge";
  case AG_STOP:
    return "STOP";
  case AG_ESCALATE:
    return "ESCALATE";
  }
  return "?";
}

static int run_agent(const demo_agent *a) {
  ag_config cfg;
  ag_error_t err;
  ag_config_init(&cfg);
  if (a->config != NULL) {
    char doc[512];
    snprintf(doc, sizeof(doc), "{\"preset\": \"default\", %s", a->config + 1);
    if (ag_config_parse(&cfg, doc, strlen(doc), &err) != AG_OK) {
      fprintf(stderr, "demo config: %s\n", err.msg);
      return -1;
    }
  }
  ag_guard *g = NULL;
  if (ag_guard_new(&g, &cfg, NULL, &err) != AG_OK) {
    fprintf(stderr, "guard: %s\n", err.msg);
    return -1;
  }
  printf("\n== %s\n", a->title);
  if (a->config != NULL)
    printf("   config: default + %s\n", a->config);
  int64_t now = 0;
  ag_guard_begin_turn(g, now);
  int stopped = 0;
  for (int it = 0; it < a->iterations && !stopped; it++, now += 1500) {
    ag_verdict v;
    if (ag_guard_begin_iteration(g, now, &v) != AG_ALLOW) {
      printf("   guard: %s [%s] %s\n", action_name(v.action),
             ag_reason_name(v.reason), v.message);
      stopped = 1;
      break;
    }
    const demo_call *row = a->script[it % a->period];
    ag_call calls[2];
    ag_call_check checks[2];
    ag_result results[2];
    for (int i = 0; i < a->width; i++) {
      calls[i].name = row[i].name;
      calls[i].args = row[i].args;
      calls[i].args_len = strlen(row[i].args);
    }
    ag_action act =
        ag_guard_check_calls(g, calls, (size_t)a->width, now, checks, &v);
    printf("   iteration %2d:", it + 1);
    for (int i = 0; i < a->width; i++) {
      char hex[65];
      ag_sig_hex(checks[i].sig, hex);
      printf("%s %s(%s) sig %.8s", i ? "," : "", row[i].name, row[i].args, hex);
    }
    printf("\n");
    if (act != AG_ALLOW) {
      printf("   guard: %s before running [%s] %s\n", action_name(act),
             ag_reason_name(v.reason), v.message);
      if (v.suggestion != NULL)
        printf("          suggestion: %s\n", v.suggestion);
      stopped = 1;
      break;
    }
    for (int i = 0; i < a->width; i++) {
      results[i].name = row[i].name;
      results[i].sig = checks[i].sig;
      results[i].category = AG_CAT_AUTO;
      if (checks[i].action == AG_NUDGE) {
        printf("   guard: nudge, %s held back: \"%s\"\n", row[i].name,
               checks[i].message);
        results[i].outcome = AG_OUTCOME_SKIPPED;
        results[i].text = checks[i].message;
      } else {
        results[i].outcome = row[i].failed ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
        results[i].text = row[i].result;
        printf("                 -> %s\n", row[i].result);
      }
      results[i].text_len = strlen(results[i].text);
    }
    act = ag_guard_record_results(g, results, (size_t)a->width, now, &v);
    if (act != AG_ALLOW) {
      if (v.warning[0])
        printf("   %s\n", v.warning);
      printf("   guard: %s after results [%s] %s\n", action_name(act),
             ag_reason_name(v.reason), v.message);
      stopped = 1;
    }
  }
  if (!stopped)
    printf("   guard: no stop; the agent kept making progress\n");
  ag_guard_free(g);
  return stopped;
}

int main(void) {
  printf("agentguard %s: the guard (preset \"default\") watching four "
         "scripted agents\n",
         ag_version());
  int stops = 0;
  for (size_t i = 0; i < sizeof(agents) / sizeof(agents[0]); i++) {
    int r = run_agent(&agents[i]);
    if (r < 0)
      return 1;
    stops += r;
  }
  printf("\n%d of %zu agents stopped.\n", stops,
         sizeof(agents) / sizeof(agents[0]));
  return 0;
}
