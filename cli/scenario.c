/*
 * cli/scenario.c - reads a scenario file (docs/scenarios.md) and turns it
 * into the pieces `agentguard simulate` hands to the agent.
 *
 * All or nothing: the file is parsed and every part checked - its keys (with
 * did-you-mean for typos), types and values, the config it amounts to with
 * --preset and --config, each tool definition (the registry compiles the
 * schemas), the approvals and human answers, and the turns (the scripted
 * provider checks the replies) - before the caller starts anything. The
 * first problem is printed as "FILE: path: what" and nothing runs.
 *
 * Data: the parsed document stays alive for the run; every string the run
 * needs (response texts, user messages, expectations) is borrowed from it.
 * Scripted responses are copied into plain arrays at load time, so the
 * tools never touch jansson objects from several threads.
 *
 * Scripted tools are native tools. The scheduler may run several calls of
 * one tool at once on its pool threads, so each tool's state - how many
 * attempts each distinct argument set has had, keyed by the call signature
 * (ag_signature: canonical JSON, so key order and number spelling do not
 * matter) - sits behind that tool's mutex. The lock is held only to pick
 * the response; the delay and the hang wait on the attempt's cancel token
 * outside it. The number of distinct argument sets a tool remembers is
 * capped (CLI_MAX_SIGNATURES); past it the tool answers with an error
 * rather than grow without bound.
 *
 * Rejected: a hash table for the signature state (scenarios have tens of
 * argument sets, a linear scan of 32-byte keys is simpler and fast enough),
 * and validating the model replies here (the scripted provider owns that
 * format and reports its own paths).
 */
#include "scenario.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define CLI_MAX_TURNS 10000
#define CLI_MAX_SIGNATURES 10000
#define CLI_MAX_DELAY_MS (24LL * 60 * 60 * 1000)
#define CLI_CONFIG_MAX_BYTES (1024 * 1024)
#define PATH_MAX_LEN 512

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum { RESP_OK, RESP_ERROR, RESP_HANG } resp_kind;

typedef struct sc_response {
  resp_kind kind;
  const char *text; /* borrowed from the document; "" for hang */
  size_t len;
  int64_t delay_ms;
} sc_response;

typedef struct sc_list {
  sc_response *items;
  size_t n;
} sc_list;

typedef struct sc_byargs {
  uint8_t sig[AG_SIG_LEN];
  sc_list list;
} sc_byargs;

typedef struct sc_seen {
  uint8_t sig[AG_SIG_LEN];
  uint64_t attempts;
} sc_seen;

typedef struct sc_tool {
  const char *name; /* borrowed: the key in "tools" */
  bool requires_approval;
  int approval;  /* -1 not given (approve), 0 deny, 1 approve */
  bool scripted; /* responses/by_args rather than command */
  sc_list responses;
  sc_byargs *by_args;
  size_t n_by_args;
  pthread_mutex_t lock;
  bool lock_ready;
  sc_seen *seen; /* guarded by lock */
  size_t n_seen, cap_seen;
} sc_tool;

typedef struct sc_human {
  bool proceed;        /* continue */
  const char *message; /* borrowed, or NULL */
} sc_human;

struct cli_scenario {
  json_t *doc;
  ag_config config;
  ag_registry *registry;
  ag_provider *provider;
  cli_turn *turns;
  size_t n_turns;
  bool any_expect;
  sc_tool *tools;
  size_t n_tools;
  sc_human *human;
  size_t n_human;
  size_t human_next;
  bool has_human;
  const char *description; /* borrowed, or NULL */
};

/* The loading context: where messages go and what they start with. */
typedef struct loader {
  const char *file;
  FILE *errf;
  cli_scenario *s;
} loader;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

/* Writes `text` with control characters (a key or tool name from the file
 * can hold "\n" or a terminal escape, and library messages quote them as
 * they are) shown as '?', so a message stays one line and cannot drive the
 * terminal. */
static void put_clean(FILE *f, const char *text) {
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    fputc(*p < 0x20 || *p == 0x7f ? '?' : *p, f);
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
fail(loader *L, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0)
    snprintf(msg, sizeof msg, "invalid scenario");
  else if ((size_t)n >= sizeof msg)
    memcpy(msg + sizeof msg - 4, "...", 4);
  fprintf(L->errf, "%s: ", L->file);
  put_clean(L->errf, msg);
  fputc('\n', L->errf);
  return AG_EXIT_USAGE;
}

static int fail_nomem(loader *L) {
  fprintf(L->errf, "%s: out of memory\n", L->file);
  return AG_EXIT_FAILURE;
}

const char *cli_json_type(const json_t *v) {
  if (v == NULL)
    return "nothing";
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "object";
  case JSON_ARRAY:
    return "array";
  case JSON_STRING:
    return "string";
  case JSON_INTEGER:
    return "integer";
  case JSON_REAL:
    return "number"; /* the library's words (ag__json_kind) */
  case JSON_TRUE:
  case JSON_FALSE:
    return "boolean";
  case JSON_NULL:
    return "null";
  }
  return "unknown";
}

/*
 * Copies a user-supplied name into `buf` for a message: control characters
 * become '?', and it is cut to 48 bytes (on a UTF-8 boundary) with "...".
 */
static const char *show(const char *s, char *buf, size_t cap) {
  size_t n = strlen(s), keep = n;
  if (keep > 48)
    keep = ag_utf8_truncate(s, n, 48);
  if (keep + 4 > cap)
    keep = ag_utf8_truncate(s, n, cap > 4 ? cap - 4 : 0);
  size_t j = 0;
  for (size_t i = 0; i < keep; i++)
    buf[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  if (keep < n) {
    memcpy(buf + j, "...", 3);
    j += 3;
  }
  buf[j] = '\0';
  return buf;
}

/* Rejects keys of `obj` not in `allowed` ("PATH.key: unknown key; ..."). */
static int check_keys(loader *L, const json_t *obj, const char *path,
                      const char *const *allowed) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i] != NULL && !ok; i++)
      ok = strcmp(key, allowed[i]) == 0;
    if (ok)
      continue;
    char k[64];
    const char *near = ag_suggest(key, allowed);
    const char *dot = path[0] ? "." : "";
    if (near != NULL)
      return fail(L, "%s%s%s: unknown key; did you mean %s?", path, dot,
                  show(key, k, sizeof k), near);
    char list[256] = "";
    size_t used = 0;
    for (size_t i = 0; allowed[i] != NULL && used < sizeof list; i++)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                               i ? ", " : "", allowed[i]);
    return fail(L, "%s%s%s: unknown key (expected one of: %s)", path, dot,
                show(key, k, sizeof k), list);
  }
  return 0;
}

/* Optional string member. *out stays NULL when absent. */
static int opt_string(loader *L, const json_t *obj, const char *key,
                      const char *path, const char **out) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return 0;
  if (!json_is_string(v))
    return fail(L, "%s%s%s: expected a string, got %s", path,
                path[0] ? "." : "", key, cli_json_type(v));
  *out = json_string_value(v);
  return 0;
}

static int opt_int(loader *L, const json_t *obj, const char *key,
                   const char *path, long long lo, long long hi,
                   long long *out) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return 0;
  if (!json_is_integer(v))
    return fail(L, "%s.%s: expected an integer, got %s", path, key,
                cli_json_type(v));
  long long x = (long long)json_integer_value(v);
  if (x < lo || x > hi)
    return fail(L, "%s.%s: %lld is out of range (%lld..%lld)", path, key, x, lo,
                hi);
  *out = x;
  return 0;
}

int cli_read_file(const char *path, size_t cap, char **buf, size_t *len,
                  char *msg, size_t msg_cap) {
  *buf = NULL;
  *len = 0;
  int fd;
  do
    fd = open(path, O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    snprintf(msg, msg_cap, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  size_t size = 0, alloc = 64 * 1024;
  char *data = malloc(alloc + 1);
  if (data == NULL) {
    close(fd);
    snprintf(msg, msg_cap, "%s: out of memory", path);
    return -1;
  }
  for (;;) {
    if (size == alloc) {
      if (alloc > cap) {
        /* read one byte past the cap: the file is too big */
        free(data);
        close(fd);
        snprintf(msg, msg_cap, "%s: larger than %zu MiB", path,
                 cap / (1024 * 1024));
        return -1;
      }
      size_t next = alloc * 2 > cap + 1 ? cap + 1 : alloc * 2;
      char *grown = realloc(data, next + 1);
      if (grown == NULL) {
        free(data);
        close(fd);
        snprintf(msg, msg_cap, "%s: out of memory", path);
        return -1;
      }
      data = grown;
      alloc = next;
    }
    ssize_t r = read(fd, data + size, alloc - size);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int e = errno;
      free(data);
      close(fd);
      snprintf(msg, msg_cap, "%s: cannot read: %s", path, strerror(e));
      return -1;
    }
    if (r == 0)
      break;
    size += (size_t)r;
  }
  close(fd);
  if (size > cap) {
    free(data);
    snprintf(msg, msg_cap, "%s: larger than %zu MiB", path,
             cap / (1024 * 1024));
    return -1;
  }
  data[size] = '\0';
  *buf = data;
  *len = size;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Scripted tools                                                           */
/* ------------------------------------------------------------------------ */

static int args_signature(const char *name, const json_t *args,
                          uint8_t sig[AG_SIG_LEN], ag_error_t *err) {
  /* The exec layer passes {} for calls without arguments; be safe anyway. */
  char *text = args != NULL ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                            : strdup("{}");
  if (text == NULL) {
    if (err != NULL) {
      ag_error_clear(err);
      err->code = AG_ENOMEM;
      snprintf(err->msg, sizeof err->msg, "out of memory");
    }
    return -1;
  }
  ag_err_t rc = ag_signature(name, text, strlen(text), sig, err);
  free(text);
  return rc == AG_OK ? 0 : -1;
}

/*
 * Picks the response for this attempt of this argument set. Returns NULL
 * with a message in `why` when the tool has nothing to answer.
 */
static const sc_response *pick(sc_tool *t, const uint8_t sig[AG_SIG_LEN],
                               char *why, size_t why_cap) {
  const sc_list *list = &t->responses;
  for (size_t i = 0; i < t->n_by_args; i++)
    if (memcmp(t->by_args[i].sig, sig, AG_SIG_LEN) == 0) {
      list = &t->by_args[i].list;
      break;
    }
  if (list->n == 0) {
    snprintf(why, why_cap,
             "scenario: tool %s has no scripted response for these "
             "arguments (add \"responses\" or a matching \"by_args\" entry)",
             t->name);
    return NULL;
  }
  pthread_mutex_lock(&t->lock);
  sc_seen *seen = NULL;
  for (size_t i = 0; i < t->n_seen; i++)
    if (memcmp(t->seen[i].sig, sig, AG_SIG_LEN) == 0) {
      seen = &t->seen[i];
      break;
    }
  if (seen == NULL) {
    if (t->n_seen == t->cap_seen) {
      if (t->cap_seen >= CLI_MAX_SIGNATURES) {
        pthread_mutex_unlock(&t->lock);
        snprintf(why, why_cap,
                 "scenario: tool %s was called with more than %d distinct "
                 "argument sets",
                 t->name, CLI_MAX_SIGNATURES);
        return NULL;
      }
      size_t next = t->cap_seen ? t->cap_seen * 2 : 16;
      if (next > CLI_MAX_SIGNATURES)
        next = CLI_MAX_SIGNATURES;
      sc_seen *grown = realloc(t->seen, next * sizeof *grown);
      if (grown == NULL) {
        pthread_mutex_unlock(&t->lock);
        snprintf(why, why_cap, "scenario: out of memory");
        return NULL;
      }
      t->seen = grown;
      t->cap_seen = next;
    }
    seen = &t->seen[t->n_seen++];
    memcpy(seen->sig, sig, AG_SIG_LEN);
    seen->attempts = 0;
  }
  uint64_t k = seen->attempts++;
  pthread_mutex_unlock(&t->lock);
  return &list->items[k < list->n ? k : list->n - 1];
}

static ag_tool_status scripted_tool(void *user, const json_t *args,
                                    ag_cancel *cancel, ag_output *out) {
  sc_tool *t = user;
  uint8_t sig[AG_SIG_LEN];
  ag_error_t err;
  if (args_signature(t->name, args, sig, &err) != 0) {
    ag_output_printf(out, "scenario: cannot sign the arguments: %s", err.msg);
    ag_output_set_transient(out, false);
    return AG_TOOL_ERROR;
  }
  char why[256];
  const sc_response *r = pick(t, sig, why, sizeof why);
  if (r == NULL) {
    ag_output_printf(out, "%s", why);
    ag_output_set_transient(out, false);
    return AG_TOOL_ERROR;
  }
  if (r->delay_ms > 0 && ag_cancel_wait(cancel, r->delay_ms) != AG_CANCEL_NONE)
    return AG_TOOL_CANCELLED;
  switch (r->kind) {
  case RESP_HANG:
    ag_cancel_wait(cancel, -1);
    return AG_TOOL_CANCELLED;
  case RESP_OK:
    ag_output_write(out, r->text, r->len);
    return AG_TOOL_OK;
  case RESP_ERROR:
    ag_output_write(out, r->text, r->len);
    return AG_TOOL_ERROR;
  }
  return AG_TOOL_ERROR;
}

/* ------------------------------------------------------------------------ */
/* Loading: tools                                                           */
/* ------------------------------------------------------------------------ */

static const char *const k_tool_keys[] = {
    "description", "parameters", "requires_approval",
    "idempotent",  "command",    "responses",
    "by_args",     "env",        NULL};
static const char *const k_response_keys[] = {"ok", "error", "hang", "delay_ms",
                                              NULL};
static const char *const k_byargs_keys[] = {"args", "responses", NULL};

static int load_response(loader *L, const json_t *v, const char *path,
                         sc_response *r) {
  if (!json_is_object(v))
    return fail(L,
                "%s: expected a response object ({\"ok\": TEXT}, "
                "{\"error\": TEXT} or {\"hang\": true}), got %s",
                path, cli_json_type(v));
  int rc = check_keys(L, v, path, k_response_keys);
  if (rc)
    return rc;
  json_t *ok = json_object_get(v, "ok"), *er = json_object_get(v, "error"),
         *hang = json_object_get(v, "hang");
  int kinds = (ok != NULL) + (er != NULL) + (hang != NULL);
  if (kinds != 1)
    return fail(L, "%s: give exactly one of \"ok\", \"error\" and \"hang\"",
                path);
  if (ok != NULL || er != NULL) {
    json_t *s = ok != NULL ? ok : er;
    if (!json_is_string(s))
      return fail(L, "%s.%s: expected a string, got %s", path,
                  ok != NULL ? "ok" : "error", cli_json_type(s));
    r->kind = ok != NULL ? RESP_OK : RESP_ERROR;
    r->text = json_string_value(s);
    r->len = json_string_length(s);
  } else {
    if (!json_is_true(hang))
      return fail(L, "%s.hang: must be true (got %s)", path,
                  json_is_false(hang) ? "false" : cli_json_type(hang));
    r->kind = RESP_HANG;
    r->text = "";
    r->len = 0;
  }
  long long delay = 0;
  rc = opt_int(L, v, "delay_ms", path, 0, CLI_MAX_DELAY_MS, &delay);
  r->delay_ms = delay;
  return rc;
}

static int load_list(loader *L, const json_t *arr, const char *path,
                     sc_list *list) {
  if (!json_is_array(arr))
    return fail(L, "%s: expected an array of responses, got %s", path,
                cli_json_type(arr));
  size_t n = json_array_size(arr);
  if (n == 0)
    return fail(L, "%s: must not be empty", path);
  list->items = calloc(n, sizeof *list->items);
  if (list->items == NULL)
    return fail_nomem(L);
  list->n = n;
  for (size_t i = 0; i < n; i++) {
    char p[PATH_MAX_LEN];
    snprintf(p, sizeof p, "%s[%zu]", path, i);
    int rc = load_response(L, json_array_get(arr, i), p, &list->items[i]);
    if (rc)
      return rc;
  }
  return 0;
}

/*
 * A tool of the scenario: the TOOL keys shared with tools files
 * (description, parameters, requires_approval, idempotent, command) are read
 * by the library's ag_registry_add_json; the scripted answers (responses,
 * by_args) here, and the scripted tool is handed to it as the native
 * implementation.
 */
static const char *const k_scripted_keys[] = {"responses", "by_args", NULL};

static int load_tool(loader *L, const char *name, const json_t *v, sc_tool *t) {
  char nm[64], path[128];
  snprintf(path, sizeof path, "tools.%s", show(name, nm, sizeof nm));
  t->name = name;
  t->approval = -1;
  if (!json_is_object(v))
    return fail(L, "%s: expected a tool object, got %s", path,
                cli_json_type(v));
  int rc = check_keys(L, v, path, k_tool_keys);
  if (rc)
    return rc;

  json_t *cmd = json_object_get(v, "command");
  json_t *resp = json_object_get(v, "responses");
  json_t *byargs = json_object_get(v, "by_args");
  if (cmd != NULL && (resp != NULL || byargs != NULL))
    return fail(L,
                "%s: give either \"command\" (a subprocess) or "
                "\"responses\"/\"by_args\" (scripted), not both",
                path);
  if (cmd == NULL && resp == NULL && byargs == NULL)
    return fail(L,
                "%s: needs \"command\" (a subprocess) or \"responses\" "
                "and/or \"by_args\" (scripted answers)",
                path);

  ag_tool_json_opts jo;
  ag_tool_json_opts_init(&jo);
  jo.path = path;
  jo.extra_keys = k_scripted_keys;
  if (cmd == NULL) {
    t->scripted = true;
    if (resp != NULL) {
      char p[PATH_MAX_LEN];
      snprintf(p, sizeof p, "%s.responses", path);
      if ((rc = load_list(L, resp, p, &t->responses)) != 0)
        return rc;
    }
    if (byargs != NULL) {
      if (!json_is_array(byargs) || json_array_size(byargs) == 0)
        return fail(L,
                    "%s.by_args: expected a non-empty array of {\"args\": "
                    "{...}, \"responses\": [...]}, got %s",
                    path,
                    json_is_array(byargs) ? "an empty array"
                                          : cli_json_type(byargs));
      size_t n = json_array_size(byargs);
      t->by_args = calloc(n, sizeof *t->by_args);
      if (t->by_args == NULL)
        return fail_nomem(L);
      t->n_by_args = n;
      for (size_t i = 0; i < n && rc == 0; i++) {
        char p[PATH_MAX_LEN], pr[PATH_MAX_LEN + 16];
        snprintf(p, sizeof p, "%s.by_args[%zu]", path, i);
        json_t *e = json_array_get(byargs, i);
        if (!json_is_object(e)) {
          rc = fail(L, "%s: expected an object, got %s", p, cli_json_type(e));
          break;
        }
        if ((rc = check_keys(L, e, p, k_byargs_keys)) != 0)
          break;
        json_t *a = json_object_get(e, "args");
        json_t *r = json_object_get(e, "responses");
        if (!json_is_object(a)) {
          rc = fail(L,
                    "%s.args: expected an object (the call's arguments), "
                    "got %s",
                    p, cli_json_type(a));
          break;
        }
        if (r == NULL) {
          rc = fail(L, "%s.responses: missing", p);
          break;
        }
        ag_error_t err;
        if (args_signature(name, a, t->by_args[i].sig, &err) != 0) {
          rc = fail(L, "%s.args: cannot be canonicalized: %s", p, err.msg);
          break;
        }
        for (size_t j = 0; j < i; j++)
          if (memcmp(t->by_args[j].sig, t->by_args[i].sig, AG_SIG_LEN) == 0) {
            rc = fail(L, "%s.args: the same arguments as by_args[%zu]", p, j);
            break;
          }
        if (rc)
          break;
        snprintf(pr, sizeof pr, "%s.responses", p);
        rc = load_list(L, r, pr, &t->by_args[i].list);
      }
      if (rc)
        return rc;
    }
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
      fprintf(L->errf, "%s: cannot create a mutex\n", L->file);
      return AG_EXIT_FAILURE;
    }
    t->lock_ready = true;
    jo.fn = scripted_tool;
    jo.user = t;
  }

  ag_error_t err;
  ag_err_t e = ag_registry_add_json(L->s->registry, name, v, &jo, &err);
  if (e == AG_ENOMEM)
    return fail_nomem(L);
  if (e != AG_OK)
    return fail(L, "%s", err.msg);
  t->requires_approval =
      ag_registry_get(L->s->registry, name)->requires_approval;
  return 0;
}

static int load_tools(loader *L, const json_t *tools) {
  if (tools == NULL)
    return 0;
  if (!json_is_object(tools))
    return fail(L, "tools: expected an object {\"NAME\": TOOL, ...}, got %s",
                cli_json_type(tools));
  size_t n = json_object_size(tools);
  if (n == 0)
    return 0;
  L->s->tools = calloc(n, sizeof *L->s->tools);
  if (L->s->tools == NULL)
    return fail_nomem(L);
  const char *name;
  json_t *v;
  json_object_foreach((json_t *)tools, name, v) {
    sc_tool *t = &L->s->tools[L->s->n_tools++];
    int rc = load_tool(L, name, v, t);
    if (rc)
      return rc;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Loading: approvals, human                                                */
/* ------------------------------------------------------------------------ */

static sc_tool *find_tool(cli_scenario *s, const char *name) {
  for (size_t i = 0; i < s->n_tools; i++)
    if (strcmp(s->tools[i].name, name) == 0)
      return &s->tools[i];
  return NULL;
}

static int load_approvals(loader *L, const json_t *ap) {
  if (ap == NULL)
    return 0;
  if (!json_is_object(ap))
    return fail(L,
                "approvals: expected an object {\"TOOL\": true|false}, got %s",
                cli_json_type(ap));
  const char *name;
  json_t *v;
  json_object_foreach((json_t *)ap, name, v) {
    char nm[64];
    sc_tool *t = find_tool(L->s, name);
    if (t == NULL) {
      const char *cands[65];
      size_t n = 0;
      for (size_t i = 0; i < L->s->n_tools && n < 64; i++)
        cands[n++] = L->s->tools[i].name;
      cands[n] = NULL;
      const char *near = ag_suggest(name, cands);
      if (near != NULL)
        return fail(L, "approvals.%s: no such tool; did you mean %s?",
                    show(name, nm, sizeof nm), near);
      return fail(L, "approvals.%s: no such tool in \"tools\"",
                  show(name, nm, sizeof nm));
    }
    if (!json_is_boolean(v))
      return fail(L, "approvals.%s: expected true or false, got %s",
                  show(name, nm, sizeof nm), cli_json_type(v));
    if (!t->requires_approval)
      return fail(L,
                  "approvals.%s: the tool does not set \"requires_approval\", "
                  "so this answer would never be asked for",
                  show(name, nm, sizeof nm));
    t->approval = json_is_true(v) ? 1 : 0;
  }
  return 0;
}

static const char *const k_human_keys[] = {"action", "message", NULL};
static const char *const k_human_actions[] = {"continue", "stop", NULL};

static int load_human(loader *L, const json_t *h) {
  if (h == NULL)
    return 0;
  if (!json_is_array(h))
    return fail(L, "human: expected an array of answers, got %s",
                cli_json_type(h));
  cli_scenario *s = L->s;
  s->has_human = true;
  size_t n = json_array_size(h);
  if (n == 0)
    return 0;
  s->human = calloc(n, sizeof *s->human);
  if (s->human == NULL)
    return fail_nomem(L);
  s->n_human = n;
  for (size_t i = 0; i < n; i++) {
    char p[64];
    snprintf(p, sizeof p, "human[%zu]", i);
    json_t *e = json_array_get(h, i);
    if (!json_is_object(e))
      return fail(L,
                  "%s: expected {\"action\": \"continue\", \"message\": ...} "
                  "or {\"action\": \"stop\"}, got %s",
                  p, cli_json_type(e));
    int rc = check_keys(L, e, p, k_human_keys);
    if (rc)
      return rc;
    const char *action = NULL;
    if ((rc = opt_string(L, e, "action", p, &action)) != 0)
      return rc;
    if (action == NULL)
      return fail(L, "%s.action: missing (\"continue\" or \"stop\")", p);
    if (strcmp(action, "continue") != 0 && strcmp(action, "stop") != 0) {
      char a[64];
      const char *near = ag_suggest(action, k_human_actions);
      if (near != NULL)
        return fail(L,
                    "%s.action: \"%s\" is not \"continue\" or \"stop\"; did "
                    "you mean %s?",
                    p, show(action, a, sizeof a), near);
      return fail(L, "%s.action: \"%s\" is not \"continue\" or \"stop\"", p,
                  show(action, a, sizeof a));
    }
    s->human[i].proceed = strcmp(action, "continue") == 0;
    if ((rc = opt_string(L, e, "message", p, &s->human[i].message)) != 0)
      return rc;
    if (!s->human[i].proceed && s->human[i].message != NULL)
      return fail(L, "%s.message: only a \"continue\" answer carries a message",
                  p);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Loading: turns and expectations                                          */
/* ------------------------------------------------------------------------ */

static const char *const k_turn_keys[] = {"user", "model", "repeat_last",
                                          "expect", NULL};
static const char *const k_expect_keys[] = {
    "status",           "reason",     "final_text_contains",
    "message_contains", "iterations", "tool_calls",
    "events",           NULL};
static const char *const k_statuses[] = {"completed", "stopped",   "escalated",
                                         "timed_out", "cancelled", "failed",
                                         NULL};
static const char *const k_extra_reasons[] = {
    "final_answer",     "loop_breaking_tool", "cancelled", "model_error",
    "script_exhausted", "out_of_memory",      NULL};
static const char *const k_events[] = {
    "turn_start",  "model_request", "provider_retry", "model_response",
    "tool_call",   "approval",      "tool_blocked",   "tool_attempt",
    "tool_result", "error_context", "nudge",          "warning",
    "escalation",  "human",         "turn_end",       NULL};

static bool in_list(const char *s, const char *const *list) {
  for (size_t i = 0; list[i] != NULL; i++)
    if (strcmp(s, list[i]) == 0)
      return true;
  return false;
}

static int one_of(loader *L, const char *path, const char *value,
                  const char *const *list, const char *what) {
  if (in_list(value, list))
    return 0;
  char v[64];
  const char *near = ag_suggest(value, list);
  if (near != NULL)
    return fail(L, "%s: \"%s\" is not %s; did you mean %s?", path,
                show(value, v, sizeof v), what, near);
  char all[512] = "";
  size_t used = 0;
  for (size_t i = 0; list[i] != NULL && used < sizeof all; i++)
    used += (size_t)snprintf(all + used, sizeof all - used, "%s%s",
                             i ? ", " : "", list[i]);
  return fail(L, "%s: \"%s\" is not %s (one of: %s)", path,
              show(value, v, sizeof v), what, all);
}

static int load_expect(loader *L, const json_t *e, const char *path,
                       cli_expect *x) {
  x->iterations = -1;
  x->tool_calls = -1;
  if (e == NULL)
    return 0;
  if (!json_is_object(e))
    return fail(L, "%s: expected an object, got %s", path, cli_json_type(e));
  int rc = check_keys(L, e, path, k_expect_keys);
  if (rc)
    return rc;
  x->present = true;
  if ((rc = opt_string(L, e, "status", path, &x->status)) != 0)
    return rc;
  if (x->status == NULL)
    return fail(L, "%s.status: missing (the turn's expected status)", path);
  char p[PATH_MAX_LEN];
  snprintf(p, sizeof p, "%s.status", path);
  if ((rc = one_of(L, p, x->status, k_statuses, "a turn status")) != 0)
    return rc;
  if ((rc = opt_string(L, e, "reason", path, &x->reason)) != 0)
    return rc;
  if (x->reason != NULL) {
    const char *reasons[AG_REASON__COUNT + 8];
    size_t n = 0;
    for (int r = 1; r < AG_REASON__COUNT; r++)
      reasons[n++] = ag_reason_name((ag_reason)r);
    for (size_t i = 0; k_extra_reasons[i] != NULL; i++)
      reasons[n++] = k_extra_reasons[i];
    reasons[n] = NULL;
    snprintf(p, sizeof p, "%s.reason", path);
    if ((rc = one_of(L, p, x->reason, reasons, "a reason code")) != 0)
      return rc;
  }
  if ((rc = opt_string(L, e, "final_text_contains", path,
                       &x->final_text_contains)) != 0 ||
      (rc = opt_string(L, e, "message_contains", path, &x->message_contains)) !=
          0)
    return rc;
  long long it = -1, tc = -1;
  if ((rc = opt_int(L, e, "iterations", path, 0, 1000000000, &it)) != 0 ||
      (rc = opt_int(L, e, "tool_calls", path, 0, 1000000000, &tc)) != 0)
    return rc;
  x->iterations = (int)it;
  x->tool_calls = (int)tc;
  json_t *ev = json_object_get(e, "events");
  if (ev != NULL) {
    if (!json_is_array(ev))
      return fail(L, "%s.events: expected an array of event patterns, got %s",
                  path, cli_json_type(ev));
    for (size_t i = 0; i < json_array_size(ev); i++) {
      json_t *pat = json_array_get(ev, i);
      snprintf(p, sizeof p, "%s.events[%zu]", path, i);
      if (!json_is_object(pat))
        return fail(L,
                    "%s: expected an object like {\"event\": \"nudge\"}, "
                    "got %s",
                    p, cli_json_type(pat));
      const char *name = NULL;
      if ((rc = opt_string(L, pat, "event", p, &name)) != 0)
        return rc;
      if (name == NULL)
        return fail(L, "%s.event: missing (the event's name)", p);
      char pe[PATH_MAX_LEN + 8];
      snprintf(pe, sizeof pe, "%s.event", p);
      if ((rc = one_of(L, pe, name, k_events, "an event")) != 0)
        return rc;
    }
    x->events = ev;
  }
  return 0;
}

static int load_turns(loader *L, const json_t *turns, json_t **for_provider) {
  cli_scenario *s = L->s;
  if (turns == NULL)
    return fail(L, "turns: missing (a list of {\"user\": ..., \"model\": "
                   "[...]})");
  if (!json_is_array(turns))
    return fail(L, "turns: expected an array, got %s", cli_json_type(turns));
  size_t n = json_array_size(turns);
  if (n == 0)
    return fail(L, "turns: must have at least one turn");
  if (n > CLI_MAX_TURNS)
    return fail(L, "turns: %zu turns, at most %d allowed", n, CLI_MAX_TURNS);
  s->turns = calloc(n, sizeof *s->turns);
  if (s->turns == NULL)
    return fail_nomem(L);
  s->n_turns = n;
  for (size_t i = 0; i < n; i++) {
    char p[64];
    snprintf(p, sizeof p, "turns[%zu]", i);
    json_t *t = json_array_get(turns, i);
    if (!json_is_object(t))
      return fail(L, "%s: expected an object, got %s", p, cli_json_type(t));
    int rc = check_keys(L, t, p, k_turn_keys);
    if (rc)
      return rc;
    if ((rc = opt_string(L, t, "user", p, &s->turns[i].user)) != 0)
      return rc;
    if (s->turns[i].user == NULL)
      return fail(L, "%s.user: missing (the user's message)", p);
    char pe[80];
    snprintf(pe, sizeof pe, "%s.expect", p);
    if ((rc = load_expect(L, json_object_get(t, "expect"), pe,
                          &s->turns[i].expect)) != 0)
      return rc;
    s->any_expect |= s->turns[i].expect.present;
  }
  /* The provider gets the turns without our "expect" key. */
  json_t *copy = json_deep_copy(turns);
  if (copy == NULL)
    return fail_nomem(L);
  for (size_t i = 0; i < n; i++)
    json_object_del(json_array_get(copy, i), "expect");
  *for_provider = copy;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Loading: config                                                          */
/* ------------------------------------------------------------------------ */

static int parse_config_doc(const json_t *doc, ag_config *cfg,
                            ag_error_t *err) {
  char *text = json_dumps(doc, JSON_COMPACT);
  if (text == NULL) {
    ag_error_clear(err);
    err->code = AG_ENOMEM;
    snprintf(err->msg, sizeof err->msg, "out of memory");
    return AG_ENOMEM;
  }
  ag_err_t rc = ag_config_parse(cfg, text, strlen(text), err);
  free(text);
  return rc;
}

/*
 * The config: the scenario's "preset" and "config" first, then --preset
 * replaces the preset name, then the keys of --config FILE go on top (a
 * preset named in that file replaces the scenario's, but not --preset).
 * Each source is checked alone first, so a message names the file it is
 * about; then the combination is parsed once more (cross-key rules).
 */
static int load_config(loader *L, const json_t *root, const char *preset_opt,
                       const char *config_path) {
  json_t *preset = json_object_get(root, "preset");
  json_t *config = json_object_get(root, "config");
  if (preset != NULL && !json_is_string(preset))
    return fail(L, "preset: expected a string, got %s", cli_json_type(preset));
  if (config != NULL && !json_is_object(config))
    return fail(L, "config: expected an object, got %s", cli_json_type(config));
  bool preset_in_config =
      config != NULL && json_object_get(config, "preset") != NULL;
  if (preset != NULL && preset_in_config)
    return fail(L, "config.preset: the preset is also given at the top level; "
                   "give it once");

  json_t *doc = config != NULL ? json_deep_copy(config) : json_object();
  if (doc == NULL)
    return fail_nomem(L);
  if (preset != NULL && json_object_set(doc, "preset", preset) != 0) {
    json_decref(doc);
    return fail_nomem(L);
  }
  ag_error_t err;
  ag_config cfg;
  ag_config_init(&cfg);
  ag_err_t rc = parse_config_doc(doc, &cfg, &err);
  if (rc != AG_OK) {
    json_decref(doc);
    if (rc == AG_ENOMEM)
      return fail_nomem(L);
    bool top = preset != NULL && strncmp(err.msg, "preset:", 7) == 0;
    return fail(L, "%s%s", top ? "" : "config.", err.msg);
  }

  if (preset_opt != NULL) {
    ag_config tmp;
    if (ag_config_preset(&tmp, preset_opt, &err) != AG_OK) {
      json_decref(doc);
      const char *m = err.msg;
      if (strncmp(m, "preset: ", 8) == 0)
        m += 8;
      fprintf(L->errf, "agentguard simulate: --preset: %s\n", m);
      return AG_EXIT_USAGE;
    }
  }
  json_t *file_doc = NULL;
  if (config_path != NULL) {
    ag_config tmp;
    ag_config_init(&tmp);
    if (ag_config_load_file(&tmp, config_path, &err) != AG_OK) {
      json_decref(doc);
      fprintf(L->errf, "%s\n", err.msg);
      return err.code == AG_ENOMEM ? AG_EXIT_FAILURE : AG_EXIT_USAGE;
    }
    char *text;
    size_t len;
    char msg[512];
    if (cli_read_file(config_path, CLI_CONFIG_MAX_BYTES, &text, &len, msg,
                      sizeof msg) != 0) {
      json_decref(doc);
      fprintf(L->errf, "%s\n", msg);
      return AG_EXIT_USAGE;
    }
    json_error_t jerr;
    file_doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(file_doc)) {
      json_decref(doc);
      json_decref(file_doc);
      fprintf(L->errf, "%s: changed while it was read\n", config_path);
      return AG_EXIT_USAGE;
    }
  }
  if (preset_opt == NULL && file_doc == NULL) {
    json_decref(doc);
    L->s->config = cfg;
    return 0;
  }

  /* Combine: sections of the file replace the scenario's key by key. */
  if (file_doc != NULL) {
    const char *key;
    json_t *v;
    json_object_foreach(file_doc, key, v) {
      json_t *mine = json_object_get(doc, key);
      int bad;
      if (json_is_object(mine) && json_is_object(v))
        bad = json_object_update(mine, v);
      else
        bad = json_object_set(doc, key, v);
      if (bad) {
        json_decref(doc);
        json_decref(file_doc);
        return fail_nomem(L);
      }
    }
    json_decref(file_doc);
  }
  if (preset_opt != NULL) {
    if (json_object_set_new(doc, "preset", json_string(preset_opt)) != 0) {
      json_decref(doc);
      return fail_nomem(L);
    }
  }
  ag_config_init(&cfg);
  rc = parse_config_doc(doc, &cfg, &err);
  json_decref(doc);
  if (rc == AG_ENOMEM)
    return fail_nomem(L);
  if (rc != AG_OK) {
    fprintf(L->errf,
            "%s: the config combined from the scenario%s%s%s is invalid: %s\n",
            L->file, preset_opt ? ", --preset" : "",
            config_path ? " and --config " : "", config_path ? config_path : "",
            err.msg);
    return AG_EXIT_USAGE;
  }
  L->s->config = cfg;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The scenario                                                             */
/* ------------------------------------------------------------------------ */

static const char *const k_top_keys[] = {"description", "preset",    "config",
                                         "tools",       "approvals", "human",
                                         "turns",       NULL};

int cli_scenario_load(cli_scenario **out, const cli_scenario_opts *opts,
                      FILE *errf) {
  *out = NULL;
  loader L = {opts->path, errf, NULL};
  char *text;
  size_t len;
  char msg[1024];
  if (cli_read_file(opts->path, CLI_SCENARIO_MAX_BYTES, &text, &len, msg,
                    sizeof msg) != 0) {
    fprintf(errf, "%s\n", msg);
    return strstr(msg, "out of memory") ? AG_EXIT_FAILURE : AG_EXIT_USAGE;
  }
  json_error_t jerr;
  json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  free(text);
  if (doc == NULL) {
    fprintf(errf, "%s:%d:%d: ", opts->path, jerr.line, jerr.column);
    put_clean(errf, jerr.text);
    fputc('\n', errf);
    return AG_EXIT_USAGE;
  }
  if (!json_is_object(doc)) {
    int rc = fail(&L, "expected a scenario object at the top level, got %s",
                  cli_json_type(doc));
    json_decref(doc);
    return rc;
  }
  cli_scenario *s = calloc(1, sizeof *s);
  if (s == NULL) {
    json_decref(doc);
    return fail_nomem(&L);
  }
  s->doc = doc;
  L.s = s;
  ag_error_t err;
  if (ag_registry_new(&s->registry, &err) != AG_OK) {
    cli_scenario_free(s);
    return fail_nomem(&L);
  }

  json_t *provider_turns = NULL;
  const char *description = NULL;
  int rc = check_keys(&L, doc, "", k_top_keys);
  if (rc == 0)
    rc = opt_string(&L, doc, "description", "", &description);
  s->description = description;
  if (rc == 0)
    rc = load_config(&L, doc, opts->preset, opts->config_path);
  if (rc == 0)
    rc = load_tools(&L, json_object_get(doc, "tools"));
  if (rc == 0)
    rc = load_approvals(&L, json_object_get(doc, "approvals"));
  if (rc == 0)
    rc = load_human(&L, json_object_get(doc, "human"));
  if (rc == 0)
    rc = load_turns(&L, json_object_get(doc, "turns"), &provider_turns);
  if (rc == 0) {
    ag_err_t e = ag_provider_scripted_new(&s->provider, provider_turns, &err);
    if (e == AG_ENOMEM)
      rc = fail_nomem(&L);
    else if (e != AG_OK)
      rc = fail(&L, "%s", err.msg);
  }
  json_decref(provider_turns);
  if (rc != 0) {
    cli_scenario_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void cli_scenario_free(cli_scenario *s) {
  if (s == NULL)
    return;
  ag_provider_free(s->provider);
  ag_registry_free(s->registry);
  for (size_t i = 0; i < s->n_tools; i++) {
    sc_tool *t = &s->tools[i];
    free(t->responses.items);
    for (size_t j = 0; j < t->n_by_args; j++)
      free(t->by_args[j].list.items);
    free(t->by_args);
    free(t->seen);
    if (t->lock_ready)
      pthread_mutex_destroy(&t->lock);
  }
  free(s->tools);
  free(s->turns);
  free(s->human);
  json_decref(s->doc);
  free(s);
}

const ag_config *cli_scenario_config(const cli_scenario *s) {
  return &s->config;
}

const ag_registry *cli_scenario_registry(const cli_scenario *s) {
  return s->registry;
}

ag_provider *cli_scenario_take_provider(cli_scenario *s) {
  ag_provider *p = s->provider;
  s->provider = NULL;
  return p;
}

size_t cli_scenario_turn_count(const cli_scenario *s) {
  return s->n_turns;
}

const cli_turn *cli_scenario_turn(const cli_scenario *s, size_t i) {
  return i < s->n_turns ? &s->turns[i] : NULL;
}

const char *cli_scenario_description(const cli_scenario *s) {
  return s->description;
}

bool cli_scenario_has_expect(const cli_scenario *s) {
  return s->any_expect;
}

/* ------------------------------------------------------------------------ */
/* Callbacks                                                                */
/* ------------------------------------------------------------------------ */

static ag_approval approve_cb(void *user, const char *tool, const char *args,
                              size_t args_len, char *reason,
                              size_t reason_cap) {
  (void)args;
  (void)args_len;
  cli_scenario *s = user;
  sc_tool *t = find_tool(s, tool);
  if (t == NULL || t->approval != 0)
    return AG_APPROVE_ONCE;
  if (reason_cap > 0)
    snprintf(reason, reason_cap, "denied by the scenario");
  return AG_APPROVE_DENY;
}

static ag_human_action human_cb(void *user, const char *record, char *hint,
                                size_t hint_cap) {
  (void)record;
  cli_scenario *s = user;
  if (s->human_next >= s->n_human)
    return AG_HUMAN_STOP;
  const sc_human *h = &s->human[s->human_next++];
  if (!h->proceed)
    return AG_HUMAN_STOP;
  if (h->message != NULL && hint_cap > 0) {
    size_t n = ag_utf8_truncate(h->message, strlen(h->message), hint_cap - 1);
    memcpy(hint, h->message, n);
    hint[n] = '\0';
  }
  return AG_HUMAN_CONTINUE;
}

void cli_scenario_callbacks(cli_scenario *s, ag_agent_opts *o) {
  o->approve = approve_cb;
  o->approve_user = s;
  if (s->has_human) {
    o->human = human_cb;
    o->human_user = s;
  } else {
    o->human = NULL;
    o->human_user = NULL;
  }
}
