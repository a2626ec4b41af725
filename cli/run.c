/*
 * cli/run.c - `agentguard run [TASK]`: a real guarded agent on the command
 * line. A model server (OpenAI-compatible or Anthropic, docs/providers.md),
 * the built-in tools confined to a workdir (docs/tools.md), user tools from
 * a tools file, and the guard of the chosen preset around the loop.
 *
 * With TASK: one turn, then exit with the exit code of docs/cli.md for it.
 * Without: an interactive session on the terminal - a prompt, the history kept
 * across turns; Ctrl-C cancels the turn in progress (a second one forces its
 * tools down), not the session; Ctrl-D or "exit" ends it.
 *
 * Approvals and escalations are asked on the terminal (/dev/tty). Without
 * one they are refused, saying how to allow them (--yes, or
 * errors.on_trip "stop"). Streamed text is written to stdout as it arrives;
 * the timeline (calls, results, nudges, stops) goes to stderr.
 *
 * Configuration: --config FILE is one JSON document: the guard's sections
 * (ag_config_parse) and "provider" (ag_provider_config_from_json); the
 * flags override both. network.timeout is the provider's total request
 * timeout unless provider.timeout is given.
 */
#define _GNU_SOURCE /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "prompt.h"
#include "scenario.h"
#include "timeline.h"
#include "trace.h"
#include "waiting.h"

#define TASK_MAX (1u << 20) /* bytes of a task or a typed line */
#define HISTORY_MAX 500     /* lines a session's history keeps */
#define PROMPT "agentguard> "
#define CONFIG_MAX (1u << 20)     /* bytes of --config */
#define TOOLS_FILE_MAX (1u << 20) /* bytes of --tools */

static const char system_prompt_fmt[] =
    "You are a careful software agent working in the directory %s. Use the "
    "tools to read, search and change files there; paths are relative to "
    "that directory and cannot leave it. Work step by step, check the "
    "results of your tool calls, and when the task is done answer with a "
    "short summary of what you did.";

typedef struct run_args {
  const char *task;
  const char *workdir;
  const char *provider;
  const char *model;
  const char *base_url;
  const char *preset;
  const char *config;
  const char *events;
  const char *tools;
  const char *events_detail;
  const char *output_format; /* "text" (default), "json" or "stream-json" */
  const char *otlp_endpoint; /* --otlp-endpoint, or NULL */
  bool yes, allow_commands, quiet;
} run_args;

typedef struct run_ctx {
  FILE *events;
  bool events_failed;
  int events_errno;
  cli_timeline *timeline;
  json_t *turn_end;
  FILE *tty; /* the terminal for questions, or NULL */
  bool yes;
  FILE *text_out;       /* the model's text: stdout, or stderr when the
                           events are on stdout (--events -) */
  bool streamed_text;   /* a streamed line is open on text_out */
  bool reply_shown;     /* the current reply's text went to stdout */
  bool json_result;     /* --output-format json: one result object per turn */
  bool result_event;    /* stream-json: the result is the stream's "result" */
  cli_waiting *waiting; /* "waiting for the model" on a terminal, or NULL */
  cli_trace *trace;     /* OpenTelemetry spans (--otlp-endpoint), or NULL */
} run_ctx;

static void usage(FILE *f) {
  fputs("usage: agentguard run [options] [TASK]\n"
        "\n"
        "Runs a guarded agent against a real model: OpenAI-compatible servers\n"
        "(OpenAI, Azure, Ollama, vLLM, llama.cpp, ...), Anthropic or Gemini.\n"
        "With TASK, one turn; without, an interactive session (Ctrl-C cancels\n"
        "the turn, Ctrl-D or 'exit' ends the session). See docs/run.md.\n"
        "\n"
        "options:\n"
        "  --workdir DIR      the directory the built-in tools work in "
        "(default: .)\n"
        "  --provider KIND    openai (default), anthropic, openai-responses,\n"
        "                     gemini or ollama\n"
        "  --model M          the model (or AGENTGUARD_MODEL, provider.model)\n"
        "  --base-url URL     the server (or AGENTGUARD_BASE_URL, "
        "provider.base_url)\n"
        "  --preset NAME      the guard's preset (default: default)\n"
        "  --config FILE      guard keys and a \"provider\" section (JSON);\n"
        "                     default ./agentguard.json, then\n"
        "                     $XDG_CONFIG_HOME/agentguard/config.json\n"
        "  --tools FILE       more tools, in the scenario's TOOL format\n"
        "  --events PATH      every event as JSON Lines ('-': stdout, and the\n"
        "                     model's text goes to stderr)\n"
        "  --output-format text|json|stream-json\n"
        "                     json: one result object per turn on stdout\n"
        "                     (status, reason, final_text, usage);\n"
        "                     stream-json: every event on stdout as it\n"
        "                     happens, then that object as a \"result\"\n"
        "                     event; both put the model's text on stderr\n"
        "  --events-detail counts|full\n"
        "                     full: model_request events carry the messages "
        "sent\n"
        "  --otlp-endpoint URL\n"
        "                     OpenTelemetry spans of each turn (OTLP/HTTP,\n"
        "                     JSON) to URL/v1/traces; default from\n"
        "                     OTEL_EXPORTER_OTLP_ENDPOINT\n"
        "  --allow-commands   offer run_command (asks before each run)\n"
        "  --yes, -y          approve every call without asking\n"
        "  --quiet, -q        no timeline on stderr\n"
        "  --help, -h         this help\n"
        "\n"
        "The API key comes from OPENAI_API_KEY, ANTHROPIC_API_KEY or\n"
        "GEMINI_API_KEY (or the variable provider.api_key_env names); never\n"
        "from a file.\n"
        "Exit codes: 0 completed; 3 stopped or escalated; 4 timed out or\n"
        "cancelled; 1 any other failure; 2 invalid input (nothing ran).\n",
        f);
}

static int64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int usage_error(const char *fmt, const char *arg) {
  return cli_usage_error("run", fmt, arg);
}

/* Returns -1 when parsed, else the exit code (help or a usage error). */
static int parse_args(int argc, char **argv, run_args *a) {
  memset(a, 0, sizeof *a);
  bool options = true;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (options && arg[0] == '-' && arg[1] != '\0') {
      if (strcmp(arg, "--") == 0) {
        options = false;
        continue;
      }
      if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
        usage(stdout);
        return AG_EXIT_OK;
      }
      if (strcmp(arg, "--yes") == 0 || strcmp(arg, "-y") == 0) {
        a->yes = true;
        continue;
      }
      if (strcmp(arg, "--allow-commands") == 0) {
        a->allow_commands = true;
        continue;
      }
      if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0) {
        a->quiet = true;
        continue;
      }
      static const char *const with_value[] = {
          "--workdir",       "--provider",      "--model",        "--base-url",
          "--preset",        "--config",        "--events",       "--tools",
          "--events-detail", "--output-format", "--otlp-endpoint"};
      const char **const slot[] = {
          &a->workdir,       &a->provider,      &a->model,        &a->base_url,
          &a->preset,        &a->config,        &a->events,       &a->tools,
          &a->events_detail, &a->output_format, &a->otlp_endpoint};
      char msg[128];
      int got = cli_value_option(argc, argv, &i, with_value, slot,
                                 sizeof(with_value) / sizeof(with_value[0]),
                                 msg, sizeof msg);
      if (got < 0)
        return usage_error("%s", msg);
      if (got == 0)
        return usage_error("unknown option '%s'", arg);
      continue;
    }
    if (a->task != NULL)
      return usage_error("one TASK only (quote it; got also '%s')", arg);
    a->task = arg;
  }
  if (a->task != NULL && strlen(a->task) > TASK_MAX)
    return usage_error("%s", "TASK is longer than 1 MiB");
  if (a->events_detail != NULL && strcmp(a->events_detail, "counts") != 0 &&
      strcmp(a->events_detail, "full") != 0)
    return usage_error("--events-detail %s: expected counts or full",
                       a->events_detail);
  if (a->output_format != NULL && strcmp(a->output_format, "text") != 0 &&
      strcmp(a->output_format, "json") != 0 &&
      strcmp(a->output_format, "stream-json") != 0)
    return usage_error("--output-format %s: expected text, json or "
                       "stream-json",
                       a->output_format);
  if (a->output_format != NULL &&
      strcmp(a->output_format, "stream-json") == 0 && a->events != NULL &&
      strcmp(a->events, "-") != 0)
    return usage_error("--output-format stream-json writes the events to "
                       "stdout; --events %s would write them again: give one",
                       a->events);
  if (a->output_format != NULL && strcmp(a->output_format, "json") == 0 &&
      a->events != NULL && strcmp(a->events, "-") == 0)
    return usage_error("%s", "--events - and --output-format json both "
                             "write to stdout: give --events a file");
  return -1;
}

/* ------------------------------------------------------------------------ */
/* Signals: the first cancels the turn, the second forces its tools down    */
/* ------------------------------------------------------------------------ */

static ag_cancel *volatile g_turn;
static volatile sig_atomic_t g_signals;
static volatile sig_atomic_t g_last_signal;

static void on_signal(int sig) {
  ag_cancel *c = g_turn;
  g_last_signal = sig;
  g_signals = g_signals + 1;
  if (c == NULL)
    return;
  if (g_signals == 1)
    ag_cancel_cancel(c, AG_CANCEL_USER);
  else
    ag_cancel_force(c);
}

/* The signals of set_handlers. */
static void stop_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGHUP);
}

static void set_handlers(bool on) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on ? on_signal : SIG_DFL;
  stop_signals(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = on ? SIG_IGN : SIG_DFL;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, NULL);
}

/* ------------------------------------------------------------------------ */
/* Events, streamed text, questions                                         */
/* ------------------------------------------------------------------------ */

static void on_event(void *user, const json_t *ev) {
  run_ctx *R = user;
  cli_trace_event(R->trace, ev);
  if (R->events != NULL && !R->events_failed) {
    int e = cli_write_event(R->events, ev);
    if (e != 0) {
      R->events_failed = true;
      R->events_errno = e;
    }
  }
  const char *name = json_string_value(json_object_get(ev, "event"));
  cli_waiting_clear(R->waiting); /* before anything is written */
  if (name != NULL && strcmp(name, "model_request") == 0)
    R->reply_shown = false; /* a new reply: its text is not out yet */
  if (R->streamed_text && name != NULL && strcmp(name, "model_response") == 0) {
    fputc('\n', R->text_out); /* end the streamed line before the timeline */
    fflush(R->text_out);
    R->streamed_text = false;
  }
  if (R->timeline != NULL)
    cli_timeline_event(R->timeline, ev);
  if (name != NULL && strcmp(name, "turn_end") == 0) {
    json_decref(R->turn_end);
    R->turn_end = json_incref((json_t *)ev);
  }
  if (name != NULL && strcmp(name, "model_request") == 0)
    cli_waiting_start(R->waiting); /* after the timeline's line */
}

static int on_delta(void *user, const char *text, size_t len) {
  run_ctx *R = user;
  cli_waiting_clear(R->waiting);
  fwrite(text, 1, len, R->text_out);
  fflush(R->text_out);
  R->streamed_text = len > 0;
  if (len > 0)
    R->reply_shown = true;
  return 0;
}

/* --output-format json: the turn's result as one JSON object on stdout. */
static void print_result(const ag_turn_outcome *o, int exit_code,
                         bool as_event) {
  json_t *j = json_pack(
      "{s:s*, s:s, s:s, s:s, s:s?, s:i, s:i, s:I, s:i}", "event",
      as_event ? "result" : NULL, "status", ag_turn_status_name(o->status),
      "reason", o->reason, "message", o->message, "final_text", o->final_text,
      "iterations", o->iterations, "tool_calls", o->tool_calls, "tokens",
      (json_int_t)o->tokens, "exit_code", exit_code);
  char *text = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
  if (text != NULL)
    printf("%s\n", text);
  else
    fprintf(stderr, "agentguard run: out of memory writing the result\n");
  free(text);
  json_decref(j);
}

/* Reads one answer line from the terminal into buf (cap bytes); false at
 * its end, or when a signal (Ctrl-C) came before or during the question. */
static bool ask(run_ctx *R, const char *question, char *buf, size_t cap) {
  sigset_t sigs, open_mask;
  stop_signals(&sigs);
  sigprocmask(SIG_BLOCK, &sigs, &open_mask);
  bool ok = false;
  if (g_signals == 0) { /* not cancelled already */
    fputs(question, R->tty);
    fflush(R->tty);
    ok = cli_wait_input(fileno(R->tty), &open_mask) &&
         fgets(buf, (int)cap, R->tty) != NULL;
  }
  sigprocmask(SIG_SETMASK, &open_mask, NULL);
  if (ok)
    buf[strcspn(buf, "\r\n")] = '\0';
  return ok;
}

/* Reads the session's next task: with the prompt's line editing, or
 * plainly when libedit could not start. */
static cli_prompt_result read_task(cli_prompt *prompt,
                                   const sigset_t *open_mask, char *buf,
                                   size_t cap) {
  if (prompt != NULL)
    return cli_prompt_read(prompt, PROMPT, open_mask, buf, cap);
  fputs(PROMPT, stderr);
  fflush(stderr);
  if (!cli_wait_input(STDIN_FILENO, open_mask))
    return CLI_PROMPT_SIGNAL;
  if (fgets(buf, (int)cap, stdin) == NULL)
    return CLI_PROMPT_EOF;
  size_t n = strcspn(buf, "\r\n");
  if (buf[n] == '\0' && n + 1 >= cap) {
    int c;
    while ((c = getchar()) != EOF && c != '\n') /* the rest of the line */
      ;
    return CLI_PROMPT_TOO_LONG;
  }
  buf[n] = '\0';
  return CLI_PROMPT_LINE;
}

static ag_approval approve(void *user, const char *tool, const char *args,
                           size_t args_len, char *reason, size_t reason_cap) {
  run_ctx *R = user;
  if (R->yes)
    return AG_APPROVE_ONCE;
  if (R->tty == NULL) {
    snprintf(reason, reason_cap,
             "no terminal to ask the user; rerun agentguard with --yes to "
             "allow such calls");
    return AG_APPROVE_DENY;
  }
  fprintf(R->tty, "\n%s wants to run: ", tool);
  cli_put_oneline(R->tty, args, args_len, 400);
  char line[64];
  if (!ask(R, "\nAllow? [y]es, [a]lways for this tool, [N]o: ", line,
           sizeof line))
    line[0] = '\0';
  if (line[0] == 'y' || line[0] == 'Y')
    return AG_APPROVE_ONCE;
  if (line[0] == 'a' || line[0] == 'A')
    return AG_APPROVE_SESSION;
  snprintf(reason, reason_cap, "the user said no");
  return AG_APPROVE_DENY;
}

static ag_human_action human(void *user, const char *record, char *hint,
                             size_t hint_cap) {
  run_ctx *R = user;
  if (R->tty == NULL)
    return AG_HUMAN_STOP; /* the turn ends escalated, the record printed */
  fputs("\nThe guard asks you to decide: ", R->tty);
  cli_put_oneline(R->tty, record, strlen(record), 600);
  char line[64];
  if (!ask(R, "\nContinue? [c]ontinue, [S]top: ", line, sizeof line) ||
      (line[0] != 'c' && line[0] != 'C'))
    return AG_HUMAN_STOP;
  if (!ask(R, "A hint for the model (Enter for none): ", hint, hint_cap))
    hint[0] = '\0';
  return AG_HUMAN_CONTINUE;
}

/* ------------------------------------------------------------------------ */
/* Setting up                                                               */
/* ------------------------------------------------------------------------ */

typedef struct setup {
  ag_config cfg;
  ag_provider_config *pcfg;
  ag_provider *provider;
  ag_registry *reg;
  char *system_prompt;
  char who[384];               /* "MODEL (KIND, URL)": the session's banner */
  ag_http_provider_opts popts; /* what the provider was made from (its
                                  strings borrowed from pcfg and argv) */
} setup;

static void setup_free(setup *S) {
  ag_provider_free(S->provider);
  ag_provider_config_free(S->pcfg);
  ag_registry_free(S->reg);
  free(S->system_prompt);
}

/* The guard's config and the provider section. 0, or an exit code. The
 * --preset flag wins over the file's "preset"; the file's keys go on top. */
static int load_config(const run_args *a, setup *S) {
  ag_error_t err;
  json_t *root = NULL;
  if (a->config != NULL) {
    char *buf = NULL, msg[256];
    size_t len = 0;
    if (cli_read_file(a->config, CONFIG_MAX, &buf, &len, msg, sizeof msg) !=
        0) {
      fprintf(stderr, "agentguard run: --config %s: %s\n", a->config, msg);
      return AG_EXIT_USAGE;
    }
    /* checked whole first: its errors name line and column */
    if (ag_config_parse(&S->cfg, buf, len, &err) != AG_OK) {
      fprintf(stderr, "%s: %s\n", a->config, err.msg);
      free(buf);
      return AG_EXIT_USAGE;
    }
    root = json_loadb(buf, len, 0, NULL);
    free(buf);
    if (root == NULL) {
      fprintf(stderr, "agentguard run: out of memory\n");
      return AG_EXIT_FAILURE;
    }
  } else {
    root = json_object();
  }
  int rc = 0;
  if (a->preset != NULL)
    json_object_set_new(root, "preset", json_string(a->preset));
  char *text = json_dumps(root, JSON_COMPACT);
  if (text == NULL) {
    rc = AG_EXIT_FAILURE;
  } else if (ag_config_parse(&S->cfg, text, strlen(text), &err) != AG_OK) {
    fprintf(stderr, "agentguard run: %s\n", err.msg);
    rc = AG_EXIT_USAGE;
  } else {
    json_t *section = json_object_get(root, "provider");
    ag_err_t pr = section != NULL
                      ? ag_provider_config_from_json(&S->pcfg, section, &err)
                      : ag_provider_config_parse(&S->pcfg, "{}", 2, &err);
    if (pr != AG_OK) {
      fprintf(stderr, "%s: %s\n", a->config != NULL ? a->config : "provider",
              err.msg);
      rc = AG_EXIT_USAGE;
    }
  }
  free(text);
  json_decref(root);
  return rc;
}

/* The provider from the config section and the flags. */
static int make_provider(const run_args *a, setup *S) {
  bool timeout_set = false;
  ag_http_provider_opts o = *ag_provider_config_opts(S->pcfg, &timeout_set);
  if (a->provider != NULL) {
    const char *const *kinds = ag_http_provider_kinds();
    size_t k = 0;
    while (kinds[k] != NULL && strcmp(kinds[k], a->provider) != 0)
      k++;
    if (kinds[k] == NULL) {
      fprintf(stderr, "agentguard run: --provider %s: unknown kind (",
              a->provider);
      for (size_t i = 0; kinds[i] != NULL; i++)
        fprintf(stderr, "%s%s", i > 0 ? ", " : "", kinds[i]);
      fprintf(stderr, ")\n");
      return AG_EXIT_USAGE;
    }
    o.kind = a->provider;
  }
  if (a->model != NULL)
    o.model = a->model;
  if (a->base_url != NULL)
    o.base_url = a->base_url;
  if (o.model == NULL || o.model[0] == '\0') {
    fprintf(stderr, "agentguard run: no model: give --model, set "
                    "AGENTGUARD_MODEL, or provider.model in --config\n");
    return AG_EXIT_USAGE;
  }
  /* network.timeout is the whole request's limit unless the provider
   * section gives its own */
  if (!timeout_set)
    o.timeout_ms = S->cfg.network.timeout_ms;
  o.parallel_tool_calls = S->cfg.loop.parallel;
  ag_error_t err;
  S->popts = o;
  if (ag_provider_http_new(&S->provider, &o, &err) != AG_OK) {
    fprintf(stderr, "agentguard run: provider: %s\n", err.msg);
    return AG_EXIT_USAGE;
  }
  snprintf(S->who, sizeof S->who, "%.120s (%s, %.200s)", o.model,
           o.kind != NULL ? o.kind : "openai",
           o.base_url != NULL && o.base_url[0] != '\0' ? o.base_url
                                                       : "its default server");
  return 0;
}

static int make_tools(const run_args *a, setup *S) {
  ag_error_t err;
  if (ag_registry_new(&S->reg, &err) != AG_OK) {
    fprintf(stderr, "agentguard run: %s\n", err.msg);
    return AG_EXIT_FAILURE;
  }
  ag_builtin_opts bo;
  ag_builtin_opts_init(&bo);
  bo.workdir = a->workdir != NULL ? a->workdir : ".";
  bo.allow_commands = a->allow_commands;
  bo.yes = a->yes;
  if (ag_builtin_register(S->reg, &bo, &err) != AG_OK) {
    fprintf(stderr, "agentguard run: --workdir %s: %s\n", bo.workdir, err.msg);
    return AG_EXIT_USAGE;
  }
  if (a->tools != NULL) {
    char *buf = NULL, msg[256];
    size_t len = 0;
    if (cli_read_file(a->tools, TOOLS_FILE_MAX, &buf, &len, msg, sizeof msg) !=
        0) {
      fprintf(stderr, "agentguard run: --tools %s: %s\n", a->tools, msg);
      return AG_EXIT_USAGE;
    }
    ag_err_t rc = ag_tools_file_load(S->reg, buf, len, &err);
    free(buf);
    if (rc != AG_OK) {
      fprintf(stderr, "%s: %s\n", a->tools, err.msg);
      return AG_EXIT_USAGE;
    }
  }
  char dir[4096];
  const char *wd = a->workdir != NULL ? a->workdir : ".";
  char *real = realpath(wd, dir);
  size_t n = sizeof(system_prompt_fmt) + strlen(real ? real : wd);
  S->system_prompt = malloc(n);
  if (S->system_prompt == NULL)
    return AG_EXIT_FAILURE;
  snprintf(S->system_prompt, n, system_prompt_fmt, real ? real : wd);
  return 0;
}

/* One turn with a fresh caller token (a cancel ends this turn only). */
static int one_turn(ag_agent *agent, const char *task, run_ctx *R, bool quiet) {
  ag_cancel *turn = NULL;
  ag_error_t err;
  if (ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, &err) !=
      AG_OK) {
    fprintf(stderr, "agentguard run: %s\n", err.msg);
    return AG_EXIT_FAILURE;
  }
  g_signals = 0;
  g_turn = turn;
  ag_turn_outcome o;
  memset(&o, 0, sizeof o);
  json_decref(R->turn_end);
  R->turn_end = NULL;
  R->streamed_text = false;
  R->reply_shown = false;
  ag_err_t e = ag_agent_run_turn(agent, task, turn, &o, &err);
  cli_waiting_clear(R->waiting);
  g_turn = NULL;
  int rc;
  if (e != AG_OK && e != AG_ENOMEM) {
    fprintf(stderr, "agentguard run: %s\n",
            err.msg[0] ? err.msg : ag_strerror(e));
    rc = AG_EXIT_FAILURE;
  } else {
    if (R->streamed_text)
      fputc('\n', R->text_out);
    if (R->timeline == NULL && !quiet)
      cli_outcome_line(stderr, 1, &o, R->turn_end);
    /* the answer on stdout when it was not streamed there (a provider
     * asked not to stream may still hand the whole text to on_delta) */
    if (o.status == AG_TURN_COMPLETED && o.final_text != NULL &&
        R->timeline != NULL && !R->reply_shown && !R->json_result)
      fprintf(R->text_out, "%s\n", o.final_text);
    rc = cli_exit_code(o.status);
    if (R->json_result)
      print_result(&o, rc, R->result_event);
  }
  fflush(R->text_out);
  ag_turn_outcome_clear(&o);
  ag_cancel_free(turn);
  return rc;
}

int cli_run(int argc, char **argv) {
  run_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  char defcfg[4096];
  cli_use_default_config("run", &a.config, defcfg, sizeof defcfg);
  char otlp_url[2048], otlp_msg[256];
  const char *otlp_headers = NULL, *otlp_service = NULL;
  int traces =
      cli_otlp(a.otlp_endpoint, otlp_url, sizeof otlp_url, &otlp_headers,
               &otlp_service, otlp_msg, sizeof otlp_msg);
  if (traces > 0)
    return usage_error("%s", otlp_msg);
  bool otlp_on = traces == 0;
  setup S;
  memset(&S, 0, sizeof S);
  if ((rc = load_config(&a, &S)) != 0 || (rc = make_provider(&a, &S)) != 0 ||
      (rc = make_tools(&a, &S)) != 0) {
    setup_free(&S);
    return rc;
  }

  run_ctx R;
  memset(&R, 0, sizeof R);
  R.yes = a.yes;
  R.tty = fopen("/dev/tty", "r+");
  R.text_out = stdout;
  R.result_event =
      a.output_format != NULL && strcmp(a.output_format, "stream-json") == 0;
  if (R.result_event)
    a.events = "-"; /* the stream is the events, then the result */
  if (a.events != NULL && (R.events = cli_open_events(a.events)) == NULL) {
    fprintf(stderr, "agentguard run: --events %s: cannot open: %s\n", a.events,
            strerror(errno));
    setup_free(&S);
    if (R.tty != NULL)
      fclose(R.tty);
    return AG_EXIT_USAGE;
  }
  R.json_result = R.result_event || (a.output_format != NULL &&
                                     strcmp(a.output_format, "json") == 0);
  if (R.events == stdout || R.json_result)
    R.text_out = stderr; /* stdout stays JSON only */
  if (!a.quiet)
    R.timeline = cli_timeline_new(stderr, isatty(STDERR_FILENO) &&
                                              getenv("NO_COLOR") == NULL);
  if (R.timeline != NULL && isatty(STDERR_FILENO))
    R.waiting = cli_waiting_new(stderr);
  /* the answer is written to the terminal already: shown once */
  cli_timeline_omit_final_text(R.timeline, isatty(fileno(R.text_out)) &&
                                               isatty(STDERR_FILENO));

  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  ao.config = S.cfg;
  ao.provider = S.provider;
  ao.tools = S.reg;
  ao.system_prompt = S.system_prompt;
  ao.approve = approve;
  ao.approve_user = &R;
  ao.human = human;
  ao.human_user = &R;
  ao.on_event = on_event;
  ao.event_user = &R;
  ao.on_delta = on_delta;
  ao.delta_user = &R;
  ao.events_full =
      a.events_detail != NULL && strcmp(a.events_detail, "full") == 0;
  ag_agent *agent = NULL;
  ag_error_t err;
  ag_otlp *otlp = NULL;
  if (otlp_on &&
      ag_otlp_start(&otlp, otlp_url, otlp_headers,
                    otlp_service != NULL ? otlp_service : "agentguard",
                    &err) != AG_OK) {
    fprintf(stderr, "agentguard run: %s\n", err.msg);
    rc = AG_EXIT_USAGE;
  } else if (otlp_on && (R.trace = cli_trace_new(
                             otlp, S.popts.model, S.popts.kind,
                             getenv("TRACEPARENT"), wall_ns())) == NULL) {
    fprintf(stderr, "agentguard run: out of memory\n");
    rc = AG_EXIT_FAILURE;
  } else if (ag_agent_new(&agent, &ao, &err) != AG_OK) {
    fprintf(stderr, "agentguard run: %s\n", err.msg);
    rc = AG_EXIT_USAGE;
  } else if (a.task != NULL) {
    set_handlers(true);
    rc = one_turn(agent, a.task, &R, a.quiet);
    set_handlers(false);
  } else if (R.tty == NULL || !isatty(STDIN_FILENO)) {
    fprintf(stderr, "agentguard run: no TASK and no terminal for an "
                    "interactive session: give the task as an argument\n");
    rc = AG_EXIT_USAGE;
  } else if (ag_http_provider_check(&S.popts, &err) != AG_OK) {
    /* a session checks the server first, not after the first message */
    fprintf(stderr,
            "agentguard run: %s\nIs the server running? Start it, or give "
            "its address with --base-url.\n",
            err.msg);
    rc = AG_EXIT_FAILURE;
  } else {
    /* the interactive session: Ctrl-C at the prompt drops the line and
     * asks again, as a shell does; SIGTERM or SIGHUP there ends it */
    rc = AG_EXIT_OK;
    char *line = malloc(TASK_MAX + 1);
    /* line editing and the session's history (libedit); without it (it
     * cannot start on this terminal) lines are read plainly */
    cli_prompt *prompt = cli_prompt_new(stdin, stderr, HISTORY_MAX);
    fprintf(stderr,
            "agentguard run: a session with %s, tools in %s\n"
            "Type a task and press Enter (Up for an earlier one). Ctrl-C "
            "cancels a turn; Ctrl-D or \"exit\" ends the session.\n",
            S.who, a.workdir != NULL ? a.workdir : ".");
    set_handlers(true);
    /* At the prompt the signals are blocked except inside ppoll, so one
     * that comes just before the wait is not lost (a plain read would
     * only be interrupted by one that comes during it). */
    sigset_t sigs, open_mask;
    stop_signals(&sigs);
    sigprocmask(SIG_BLOCK, &sigs, &open_mask);
    while (line != NULL) {
      fputc('\n', stderr);
      g_last_signal = 0;
      cli_prompt_result got = read_task(prompt, &open_mask, line, TASK_MAX + 1);
      if (got == CLI_PROMPT_SIGNAL) {
        if (g_last_signal == SIGINT)
          continue; /* Ctrl-C: the line is dropped, asked again */
        rc = 128 + g_last_signal;
        break;
      }
      if (got == CLI_PROMPT_EOF) {
        rc = AG_EXIT_OK; /* Ctrl-D: the session ended as asked */
        break;
      }
      if (got == CLI_PROMPT_TOO_LONG) {
        fprintf(stderr,
                "agentguard run: the line is longer than %u bytes; give a "
                "longer task as an argument or from a file\n",
                TASK_MAX);
        continue;
      }
      if (strcmp(line, "exit") == 0 || strcmp(line, "quit") == 0) {
        rc = AG_EXIT_OK;
        break;
      }
      if (line[strspn(line, " \t")] == '\0')
        continue;
      sigprocmask(SIG_SETMASK, &open_mask, NULL);
      rc = one_turn(agent, line, &R, a.quiet);
      sigprocmask(SIG_BLOCK, &sigs, NULL);
    }
    cli_prompt_free(prompt);
    sigprocmask(SIG_SETMASK, &open_mask, NULL);
    set_handlers(false);
    free(line);
  }

  ag_agent_free(agent);
  cli_trace_free(R.trace);
  if (otlp != NULL) { /* the spans of the session go now, 2 s at most */
    unsigned long long lost = ag_otlp_stop(otlp, 2000);
    if (lost > 0)
      fprintf(stderr, "agentguard run: %llu span%s could not be sent to %s\n",
              lost, lost == 1 ? "" : "s", otlp_url);
  }
  cli_waiting_free(R.waiting);
  cli_timeline_free(R.timeline);
  json_decref(R.turn_end);
  if (R.tty != NULL)
    fclose(R.tty);
  if (R.events != NULL && R.events != stdout && fclose(R.events) != 0 &&
      !R.events_failed) {
    R.events_failed = true;
    R.events_errno = errno;
  }
  if (R.events_failed) {
    fprintf(stderr, "agentguard run: cannot write events to %s: %s\n", a.events,
            strerror(R.events_errno));
    if (rc != AG_EXIT_USAGE)
      rc = AG_EXIT_FAILURE;
  }
  setup_free(&S);
  return rc;
}
