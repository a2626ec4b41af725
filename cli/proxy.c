/*
 * cli/proxy.c - `agentguard proxy`: an OpenAI- and Anthropic-compatible
 * HTTP proxy that guards the tool loop passing through it (src/proxy/,
 * docs/proxy.md).
 *
 * Serves until SIGINT or SIGTERM: both are blocked before the server's
 * threads start (they inherit the mask) and taken here with sigwait, so no
 * handler runs on another thread.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cli.h"
#include "agentguard.h"
#include "agentguard/proxy.h"
#include "scenario.h"

#define CONFIG_MAX (1u << 20)

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: agentguard proxy --upstream URL [options]\n\n"
      "A proxy that guards the tool loop of any agent: point the agent's\n"
      "base URL (OPENAI_BASE_URL, ANTHROPIC_BASE_URL,\n"
      "GOOGLE_GEMINI_BASE_URL) at it. Guarded: POST /v1/chat/completions\n"
      "(OpenAI Chat Completions), /v1/responses (OpenAI Responses),\n"
      "/v1/messages (Anthropic Messages) and /v1beta/models/M:generateContent\n"
      "and :streamGenerateContent (Gemini). GET /healthz, /readyz and\n"
      "/metrics are the proxy's own; every other request is passed through.\n"
      "See docs/proxy.md.\n\n"
      "options:\n"
      "  --listen HOST:PORT     address to serve on (default 127.0.0.1:8787;\n"
      "                         a host name, or [::1]:8787 for IPv6)\n"
      "  --upstream URL         the real API, e.g. https://api.openai.com/v1\n"
      "  --openai-upstream URL  the same as --upstream\n"
      "  --anthropic-upstream URL\n"
      "                         Anthropic's paths (/v1/messages...) go there\n"
      "  --gemini-upstream URL  Gemini's paths (/v1beta/...) go there\n"
      "  --preset NAME          the guard's preset (default: default)\n"
      "  --config FILE          a config file (its keys on top of the "
      "preset);\n"
      "                         default ./agentguard.json, then\n"
      "                         $XDG_CONFIG_HOME/agentguard/config.json\n"
      "  --events FILE          append the proxy's decisions as JSON Lines\n"
      "  --log-format text|json the access log on stderr: one line per\n"
      "                         request answered (default text)\n"
      "  --quiet, -q            no access log\n"
      "  --otlp-endpoint URL    OpenTelemetry traces (OTLP/HTTP, JSON) to\n"
      "                         URL/v1/traces; default from\n"
      "                         OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or\n"
      "                         OTEL_EXPORTER_OTLP_ENDPOINT\n"
      "  --max-body BYTES       request body cap (default 33554432)\n"
      "  --max-connections N    client connections served at once, 1 to\n"
      "                         65536 (default 512); when all are taken, the\n"
      "                         one idle longest gives way to a new one\n"
      "  --max-connections-per-client N\n"
      "                         per client address (default: a quarter of\n"
      "                         --max-connections, loopback not capped)\n"
      "  --idle-timeout S       a connection with no request (default 120)\n"
      "  --header-timeout S     request line to the end of the headers\n"
      "                         (default 10)\n"
      "  --request-timeout S    request line to the end of the body\n"
      "                         (default 120)\n"
      "  --drain-timeout S      on SIGTERM or Ctrl-C, how long the requests\n"
      "                         under way may take to finish while new\n"
      "                         ones get a 503 (default 10; 0: stop at once)\n"
      "  --max-buffered BYTES   guarded replies held whole at once, over all\n"
      "                         connections (default 268435456); past it a\n"
      "                         reply waits for another to be sent\n"
      "  --client-key-env NAME  clients must send the key in $NAME as\n"
      "                         x-agentguard-key (required off loopback)\n"
      "\nSee docs/proxy.md.\n");
}

static int usage_error(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return cli_usage_error("proxy", "%s", msg);
}

typedef struct proxy_args {
  const char *listen, *upstream, *openai_upstream, *preset, *config, *events,
      *max_body, *key_env, *max_connections, *per_client, *idle_timeout,
      *header_timeout, *request_timeout, *max_buffered, *drain_timeout,
      *anthropic_upstream, *gemini_upstream, *log_format, *otlp_endpoint;
  bool quiet;
} proxy_args;

static int parse_args(int argc, char **argv, proxy_args *a) {
  static const char *const names[] = {
      "--listen",          "--upstream",
      "--openai-upstream", "--preset",
      "--config",          "--events",
      "--max-body",        "--client-key-env",
      "--max-connections", "--max-connections-per-client",
      "--idle-timeout",    "--header-timeout",
      "--request-timeout", "--max-buffered",
      "--drain-timeout",   "--anthropic-upstream",
      "--gemini-upstream", "--log-format",
      "--otlp-endpoint"};
  const char **const slot[] = {&a->listen,          &a->upstream,
                               &a->openai_upstream, &a->preset,
                               &a->config,          &a->events,
                               &a->max_body,        &a->key_env,
                               &a->max_connections, &a->per_client,
                               &a->idle_timeout,    &a->header_timeout,
                               &a->request_timeout, &a->max_buffered,
                               &a->drain_timeout,   &a->anthropic_upstream,
                               &a->gemini_upstream, &a->log_format,
                               &a->otlp_endpoint};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      usage(stdout);
      return AG_EXIT_OK;
    }
    if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0) {
      a->quiet = true;
      continue;
    }
    char msg[128];
    int got =
        cli_value_option(argc, argv, &i, names, slot,
                         sizeof(names) / sizeof(names[0]), msg, sizeof msg);
    if (got < 0)
      return usage_error("%s", msg);
    if (got == 0)
      return usage_error("unknown %s '%s'",
                         arg[0] == '-' ? "option" : "argument", arg);
  }
  if (a->upstream != NULL && a->openai_upstream != NULL)
    return usage_error("give --upstream or --openai-upstream, not both");
  if (a->upstream == NULL)
    a->upstream = a->openai_upstream;
  return -1;
}

/* The options a config file's "proxy" section and the environment may
 * set: each flag's name without "--", '-' as '_' (the section's key), and
 * AGENTGUARD_PROXY_ + its upper case (the variable). A flag wins over the
 * variable, which wins over the file. */
#define PROXY_KEYS 16
static void proxy_keys(proxy_args *a, const char *keys[PROXY_KEYS + 1],
                       const char **slots[PROXY_KEYS]) {
  static const char *const names[PROXY_KEYS + 1] = {
      "listen",
      "upstream",
      "anthropic_upstream",
      "gemini_upstream",
      "events",
      "max_body",
      "client_key_env",
      "max_connections",
      "max_connections_per_client",
      "idle_timeout",
      "header_timeout",
      "request_timeout",
      "max_buffered",
      "drain_timeout",
      "log_format",
      "otlp_endpoint",
      NULL};
  const char **const s[PROXY_KEYS] = {
      &a->listen,          &a->upstream,        &a->anthropic_upstream,
      &a->gemini_upstream, &a->events,          &a->max_body,
      &a->key_env,         &a->max_connections, &a->per_client,
      &a->idle_timeout,    &a->header_timeout,  &a->request_timeout,
      &a->max_buffered,    &a->drain_timeout,   &a->log_format,
      &a->otlp_endpoint};
  for (int i = 0; i <= PROXY_KEYS; i++)
    keys[i] = names[i];
  for (int i = 0; i < PROXY_KEYS; i++)
    slots[i] = s[i];
}

/* Fills the options no flag gave from AGENTGUARD_PROXY_* and then from the
 * config's "proxy" section (numbers kept as their decimal text in `nums`).
 * 0, or an exit code. */
static int fill_from_config(proxy_args *a, const json_t *section,
                            const char *file, char nums[PROXY_KEYS][32]) {
  const char *keys[PROXY_KEYS + 1];
  const char **slots[PROXY_KEYS];
  proxy_keys(a, keys, slots);
  for (int i = 0; i < PROXY_KEYS; i++) {
    if (*slots[i] != NULL)
      continue; /* the flag */
    char var[64] = "AGENTGUARD_PROXY_";
    size_t n = strlen(var);
    for (const char *k = keys[i]; *k != '\0' && n + 1 < sizeof var; k++)
      var[n++] = (char)(*k >= 'a' && *k <= 'z' ? *k - 'a' + 'A' : *k);
    var[n] = '\0';
    const char *env = getenv(var);
    if (env != NULL && env[0] != '\0')
      *slots[i] = env;
  }
  if (section == NULL)
    return 0;
  if (!json_is_object(section)) {
    fprintf(stderr, "agentguard proxy: %s: proxy: expected an object\n", file);
    return AG_EXIT_USAGE;
  }
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)section, key, v) {
    int i = 0;
    while (i < PROXY_KEYS && strcmp(keys[i], key) != 0)
      i++;
    if (i == PROXY_KEYS) {
      const char *near = ag_suggest(key, keys);
      fprintf(stderr, "agentguard proxy: %s: proxy.%s: unknown key%s%s%s\n",
              file, key, near != NULL ? "; did you mean " : "",
              near != NULL ? near : "", near != NULL ? "?" : "");
      return AG_EXIT_USAGE;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
      snprintf(nums[i], sizeof nums[i], "%lld",
               (long long)json_integer_value(v));
    } else if (!json_is_string(v)) {
      fprintf(stderr,
              "agentguard proxy: %s: proxy.%s: expected a string or a "
              "whole number\n",
              file, key);
      return AG_EXIT_USAGE;
    }
    if (*slots[i] == NULL)
      *slots[i] = json_is_string(v) ? json_string_value(v) : nums[i];
  }
  return 0;
}

/* The guard's config: the file, with --preset winning over its "preset". */
static int load_config(const proxy_args *a, ag_config *cfg) {
  ag_error_t err;
  json_t *root = NULL;
  if (a->config != NULL) {
    char *buf = NULL, msg[256];
    size_t len = 0;
    if (cli_read_file(a->config, CONFIG_MAX, &buf, &len, msg, sizeof msg) !=
        0) {
      fprintf(stderr, "agentguard proxy: --config %s: %s\n", a->config, msg);
      return AG_EXIT_USAGE;
    }
    if (ag_config_parse(cfg, buf, len, &err) != AG_OK) {
      fprintf(stderr, "%s: %s\n", a->config, err.msg);
      free(buf);
      return AG_EXIT_USAGE;
    }
    root = json_loadb(buf, len, 0, NULL);
    free(buf);
  } else {
    root = json_object();
  }
  if (root == NULL) {
    fprintf(stderr, "agentguard proxy: out of memory\n");
    return AG_EXIT_FAILURE;
  }
  if (a->preset != NULL)
    json_object_set_new(root, "preset", json_string(a->preset));
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  int rc = 0;
  if (text == NULL) {
    fprintf(stderr, "agentguard proxy: out of memory\n");
    rc = AG_EXIT_FAILURE;
  } else if (ag_config_parse(cfg, text, strlen(text), &err) != AG_OK) {
    fprintf(stderr, "agentguard proxy: %s\n", err.msg);
    rc = AG_EXIT_USAGE;
  }
  free(text);
  return rc;
}

static int run_proxy(proxy_args *pa);

/* The config file's document, for its "proxy" section (NULL without
 * --config); on a file that cannot be read or is not JSON, load_config
 * says why, and *rc is its exit code. */
static json_t *config_doc(const proxy_args *a, int *rc) {
  *rc = 0;
  if (a->config == NULL)
    return NULL;
  char *buf = NULL, msg[256];
  size_t len = 0;
  json_t *root = NULL;
  if (cli_read_file(a->config, CONFIG_MAX, &buf, &len, msg, sizeof msg) == 0)
    root = json_loadb(buf, len, 0, NULL);
  free(buf);
  if (root == NULL) {
    ag_config cfg;
    *rc = load_config(a, &cfg);
    if (*rc == 0)
      *rc = AG_EXIT_FAILURE; /* read once, not twice: out of memory */
  }
  return root;
}

int cli_proxy(int argc, char **argv) {
  proxy_args a;
  memset(&a, 0, sizeof a);
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  char defcfg[4096];
  cli_use_default_config("proxy", &a.config, defcfg, sizeof defcfg);
  json_t *doc = config_doc(&a, &rc);
  if (rc != 0)
    return rc;
  char nums[PROXY_KEYS][32];
  rc = fill_from_config(&a, json_object_get(doc, "proxy"), a.config, nums);
  if (rc == 0 && a.upstream == NULL)
    rc = usage_error("--upstream URL is required (or proxy.upstream in "
                     "--config, or AGENTGUARD_PROXY_UPSTREAM)");
  if (rc == 0)
    rc = run_proxy(&a);
  json_decref(doc);
  return rc;
}

/* Where traces go: cli_otlp (args.h). 0, or an exit code. */
static int otlp_opts(const proxy_args *a, ag_proxy_opts *o, char *url,
                     size_t cap) {
  char msg[256];
  int got = cli_otlp(a->otlp_endpoint, url, cap, &o->otlp_headers,
                     &o->otlp_service_name, msg, sizeof msg);
  if (got > 0)
    return usage_error("%s", msg);
  if (got == 0)
    o->otlp_traces_url = url;
  return 0;
}

static int run_proxy(proxy_args *pa) {
  proxy_args a = *pa;
  int rc;
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.upstream = a.upstream;
  o.anthropic_upstream = a.anthropic_upstream;
  o.gemini_upstream = a.gemini_upstream;
  char host[64] = "127.0.0.1";
  if (a.listen != NULL) {
    const char *colon = strrchr(a.listen, ':');
    char *end = NULL;
    long port = colon != NULL ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon == a.listen ||
        (size_t)(colon - a.listen) >= sizeof host || end == colon + 1 ||
        *end != '\0' || port < 0 || port > 65535)
      return usage_error("--listen %s: expected HOST:PORT, e.g. 127.0.0.1:8787",
                         a.listen);
    memcpy(host, a.listen, (size_t)(colon - a.listen));
    host[colon - a.listen] = '\0';
    /* an IPv6 address is written in brackets: [::1]:8787 */
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
      memmove(host, host + 1, hl - 2);
      host[hl - 2] = '\0';
    }
    o.port = (uint16_t)port;
  }
  o.listen_host = host;
  if (a.max_body != NULL) {
    char *end = NULL;
    unsigned long long v = strtoull(a.max_body, &end, 10);
    if (end == a.max_body || *end != '\0' || v == 0 || v > (1ull << 30) ||
        a.max_body[0] == '-')
      return usage_error("--max-body %s: expected a number of bytes from 1 to "
                         "1073741824",
                         a.max_body);
    o.max_body = (size_t)v;
  }
  if (a.max_buffered != NULL) {
    char *end = NULL;
    unsigned long long v = strtoull(a.max_buffered, &end, 10);
    if (end == a.max_buffered || *end != '\0' || v < (1ull << 20) ||
        v > (1ull << 40) || a.max_buffered[0] == '-')
      return usage_error("--max-buffered %s: expected a number of bytes from "
                         "1048576 to 1099511627776",
                         a.max_buffered);
    o.max_buffered = (size_t)v;
  }
  if (a.max_connections != NULL) {
    char *end = NULL;
    errno = 0;
    long v = strtol(a.max_connections, &end, 10);
    if (end == a.max_connections || *end != '\0' || errno != 0 || v < 1 ||
        v > AG_PROXY_MAX_CONNECTIONS_LIMIT)
      return usage_error("--max-connections %s: expected a number from 1 to %d",
                         a.max_connections, AG_PROXY_MAX_CONNECTIONS_LIMIT);
    o.max_connections = (int)v;
  }
  if (a.per_client != NULL) {
    char *end = NULL;
    errno = 0;
    long v = strtol(a.per_client, &end, 10);
    if (end == a.per_client || *end != '\0' || errno != 0 || v < 1 ||
        v > AG_PROXY_MAX_CONNECTIONS_LIMIT)
      return usage_error("--max-connections-per-client %s: expected a number "
                         "from 1 to --max-connections",
                         a.per_client);
    o.max_connections_per_client = (int)v;
  }
  const char *const tnames[] = {"--idle-timeout", "--header-timeout",
                                "--request-timeout"};
  const char *const tvals[] = {a.idle_timeout, a.header_timeout,
                               a.request_timeout};
  int64_t *const touts[] = {&o.idle_timeout_ms, &o.header_timeout_ms,
                            &o.request_timeout_ms};
  for (int i = 0; i < 3; i++) {
    if (tvals[i] == NULL)
      continue;
    char *end = NULL;
    errno = 0;
    long v = strtol(tvals[i], &end, 10);
    if (end == tvals[i] || *end != '\0' || errno != 0 || v < 1 || v > 86400)
      return usage_error("%s %s: expected seconds from 1 to 86400", tnames[i],
                         tvals[i]);
    *touts[i] = (int64_t)v * 1000;
  }
  int64_t drain_ms = 10000;
  if (a.drain_timeout != NULL) {
    char *end = NULL;
    errno = 0;
    long v = strtol(a.drain_timeout, &end, 10);
    if (end == a.drain_timeout || *end != '\0' || errno != 0 || v < 0 ||
        v > 86400)
      return usage_error("--drain-timeout %s: expected seconds from 0 to "
                         "86400",
                         a.drain_timeout);
    drain_ms = (int64_t)v * 1000;
  }
  if (a.key_env != NULL) {
    const char *k = getenv(a.key_env);
    if (k == NULL || k[0] == '\0')
      return usage_error("--client-key-env %s: the variable is not set or "
                         "empty",
                         a.key_env);
    o.client_key = k;
  }
  rc = load_config(&a, &o.cfg);
  if (rc != 0)
    return rc;
  if (a.log_format != NULL && strcmp(a.log_format, "text") != 0 &&
      strcmp(a.log_format, "json") != 0)
    return usage_error("--log-format %s: expected text or json", a.log_format);
  if (!a.quiet) {
    o.access_log = stderr;
    o.access_log_json =
        a.log_format != NULL && strcmp(a.log_format, "json") == 0;
  }
  char otlp_url[2048];
  if ((rc = otlp_opts(&a, &o, otlp_url, sizeof otlp_url)) != 0)
    return rc;
  FILE *events = NULL;
  if (a.events != NULL) {
    events = fopen(a.events, "a");
    if (events == NULL) {
      perror(a.events);
      return AG_EXIT_USAGE;
    }
    o.events = events;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  /* Large blocks (held replies: up to 32 MiB each) are mapped and unmapped
   * by glibc's malloc at a fixed size, so that the memory of a reply goes
   * back to the system when it is freed: by default the threshold rises
   * with each large free and the freed replies stay in the heaps of the
   * proxy's threads (bench_proxy_memory, 40 replies of 3.5 MB under
   * --max-buffered 32 MiB: a peak of 223 MiB without this, 90 MiB with
   * it). 1 MiB, not less: the guard each request replays its turn through
   * holds a 434 KB block (its content-loop detector), which must come from
   * the heap - mapped and unmapped per request, it and its page faults
   * were a third of the proxy's CPU (bench/throughput.sh, perf). The top
   * of a thread's heap is given back past 1 MiB free, not 128 KiB: the
   * same block freed at the top was otherwise trimmed and faulted in
   * again by the next request. */
  mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
  ag_proxy *p = NULL;
  ag_error_t err;
  if (ag_proxy_start(&p, &o, &err) != AG_OK) {
    fprintf(stderr, "agentguard proxy: %s\n", err.msg);
    if (events != NULL)
      fclose(events);
    return err.code == AG_EIO ? AG_EXIT_FAILURE : AG_EXIT_USAGE;
  }
  fprintf(stderr,
          "agentguard proxy: listening on http://%s%s%s:%u (upstream %s, "
          "preset %s); Ctrl-C stops\n",
          strchr(host, ':') != NULL ? "[" : "", host,
          strchr(host, ':') != NULL ? "]" : "", (unsigned)ag_proxy_port(p),
          ag_proxy_upstream(p), o.cfg.preset);
  if (o.otlp_traces_url != NULL)
    fprintf(stderr, "agentguard proxy: traces to %s (OTLP/HTTP, JSON)\n",
            o.otlp_traces_url);
  int sig = 0;
  sigwait(&set, &sig);
  if (drain_ms > 0) {
    /* a rolling update's SIGTERM: the requests under way finish, new ones
     * get a 503, for at most --drain-timeout */
    fprintf(stderr,
            "agentguard proxy: draining: new requests get a 503; waiting up "
            "to %lld s for the requests under way\n",
            (long long)(drain_ms / 1000));
    if (!ag_proxy_drain(p, drain_ms))
      fprintf(stderr, "agentguard proxy: --drain-timeout passed; the "
                      "requests left are cut\n");
  }
  ag_proxy_stop(p);
  fprintf(stderr, "agentguard proxy: stopped\n");
  if (events != NULL && fclose(events) != 0) {
    perror(a.events);
    return AG_EXIT_FAILURE;
  }
  return AG_EXIT_OK;
}
