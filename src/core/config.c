/*
 * src/core/config.c - configuration: presets, JSON parsing with key-path
 * errors, validation, JSON output, durations.
 *
 * Design note. Every config key is one row of `keys[]`: section, name, kind
 * (integer, boolean, duration, enum, string list), where it lives in
 * ag_config (offsetof), its range, its enum names and its value in the
 * `none` preset. Building presets, parsing, validating, writing JSON and the
 * did-you-mean suggestions are all driven by that table, so a new key is one
 * row here plus a field in core.h and a line in docs/configuration.md.
 *
 * Presets are data as well: `presets[]` gives each one a parent and a list of
 * "section.key" = text overrides. A preset is built by zeroing the struct
 * (so padding and unused list slots compare equal with memcmp), applying
 * every key's `none` value, then the overrides of each ancestor from the root
 * down. The overrides are text (the same spelling as in a config file) rather
 * than a second struct literal per preset: a preset then reads like the
 * table in the docs, and ag_config_init can never fail nor allocate.
 *
 * Parsing goes into a copy and is copied out only when the whole document
 * and the cross-key rules are valid, so a failed parse changes nothing.
 *
 * Thread-safety: no globals besides constant tables; every function is safe
 * from any thread on distinct objects.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "internal.h"

/* Longest duration accepted anywhere: 7 days ("168h"). Long enough for any
 * turn or wait a person means; short enough that adding two durations to a
 * monotonic clock can never overflow. */
#define DURATION_CAP_MS INT64_C(604800000)
#define COUNT_MAX 1000000

/* Enums are stored and read through memcpy as int. */
_Static_assert(sizeof(ag_call_scope) == sizeof(int), "enum size");
_Static_assert(sizeof(ag_failing_iteration) == sizeof(int), "enum size");
_Static_assert(sizeof(ag_on_trip) == sizeof(int), "enum size");
_Static_assert(sizeof(ag_counted_failures) == sizeof(int), "enum size");
_Static_assert(sizeof(ag_feedback) == sizeof(int), "enum size");
_Static_assert(sizeof(ag_backoff) == sizeof(int), "enum size");
_Static_assert(sizeof(ag_retry_on) == sizeof(int), "enum size");
_Static_assert(sizeof(bool) == 1, "bool is one byte");

/* ------------------------------------------------------------------------ */
/* The key table                                                            */
/* ------------------------------------------------------------------------ */

typedef enum { K_INT, K_BOOL, K_DURATION, K_ENUM, K_LIST } key_kind;

typedef struct key_desc {
  const char *section;
  const char *name;
  key_kind kind;
  size_t off;
  int64_t min, max;         /* K_INT, K_DURATION */
  const char *const *enums; /* K_ENUM: names by value, NULL-terminated */
  const char *none;         /* value in the `none` preset, as text */
} key_desc;

static const char *const scope_names[] = {"call", "call_and_result", NULL};
static const char *const failing_names[] = {"all_failed", "any_failed", NULL};
static const char *const on_trip_names[] = {"stop", "escalate", NULL};
static const char *const counted_names[] = {"all", "malfunctions", NULL};
static const char *const feedback_names[] = {"compact", "full", "generic",
                                             NULL};
static const char *const backoff_names[] = {"linear", "exponential", "constant",
                                            NULL};
static const char *const retry_on_names[] = {"transient", "all", "none", NULL};

#define FIELD(sec, name) offsetof(ag_config, sec.name)
#define KEY(sec, name, kind, off, lo, hi, enums, none)                         \
  { #sec, #name, kind, off, lo, hi, enums, none }
#define KINT(sec, name, lo, hi, none)                                          \
  KEY(sec, name, K_INT, FIELD(sec, name), lo, hi, NULL, none)
#define KCOUNT(sec, name, none) KINT(sec, name, 0, COUNT_MAX, none)
#define KBOOL(sec, name, none)                                                 \
  KEY(sec, name, K_BOOL, FIELD(sec, name), 0, 1, NULL, none)
#define KDUR(sec, name, none)                                                  \
  KEY(sec, name, K_DURATION, FIELD(sec, name##_ms), 0, DURATION_CAP_MS, NULL,  \
      none)
#define KENUM(sec, name, names, none)                                          \
  KEY(sec, name, K_ENUM, FIELD(sec, name), 0, 0, names, none)
#define KLIST(sec, name, none)                                                 \
  KEY(sec, name, K_LIST, FIELD(sec, name), 0, AG_LIST_MAX, NULL, none)

/* Lists in the `none` column and in preset overrides are comma-separated. */
static const key_desc keys[] = {
    KCOUNT(loop, max_iterations, "0"),
    KCOUNT(loop, max_calls_per_turn, "0"),
    KCOUNT(loop, identical_call_limit, "0"),
    KENUM(loop, identical_call_scope, scope_names, "call"),
    KCOUNT(loop, cycle_limit, "0"),
    KINT(loop, cycle_max_length, 2, 16, "5"),
    KDUR(loop, max_turn_duration, "0"),
    KCOUNT(loop, max_refused_replies, "0"),
    KCOUNT(loop, max_denied_calls, "0"),
    KINT(loop, content_loop_repeats, 0, 1000, "0"),
    KCOUNT(loop, max_empty_replies, "0"),
    KCOUNT(loop, repeated_result_limit, "0"),
    KCOUNT(loop, repeated_failure_limit, "0"),
    KINT(loop, max_tokens_per_turn, 0, 2000000000, "0"),
    KBOOL(loop, nudge_before_stop, "false"),
    KBOOL(loop, final_request_without_tools, "false"),
    KBOOL(loop, require_tool_call, "false"),
    KLIST(loop, loop_breaking_tools, ""),
    KBOOL(loop, parallel, "true"),
    KINT(loop, max_parallel, 1, 256, "8"),

    KCOUNT(errors, max_identical_errors, "0"),
    KCOUNT(errors, max_tool_errors, "0"),
    KCOUNT(errors, max_consecutive_errors, "0"),
    KENUM(errors, failing_iteration, failing_names, "all_failed"),
    KENUM(errors, counted_failures, counted_names, "all"),
    KCOUNT(errors, max_total_errors, "0"),
    KCOUNT(errors, similar_error_limit, "0"),
    KINT(errors, error_history, 1, 256, "10"),
    KLIST(errors, error_prefixes, ""),
    KENUM(errors, on_trip, on_trip_names, "stop"),
    KENUM(errors, feedback, feedback_names, "full"),
    KINT(errors, max_error_chars, 1, 65536, "200"),
    KBOOL(errors, error_context, "false"),
    KINT(errors, max_errors_in_context, 1, 64, "3"),
    KBOOL(errors, normalize_errors, "false"),
    KBOOL(errors, normalize_provider_errors, "true"),
    KBOOL(errors, include_provider_details, "false"),

    KINT(retry, max_retries, 0, 100, "0"),
    KDUR(retry, delay, "1s"),
    KENUM(retry, backoff, backoff_names, "linear"),
    KDUR(retry, max_delay, "30s"),
    KBOOL(retry, jitter, "false"),
    KDUR(retry, function_timeout, "0"),
    KENUM(retry, retry_on, retry_on_names, "transient"),

    KINT(network, max_retries, 0, 100, "0"),
    KDUR(network, delay, "1s"),
    KDUR(network, max_delay, "30s"),
    KDUR(network, timeout, "0"),
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

static const char *const sections[] = {"loop", "errors", "retry", "network"};
#define N_SECTIONS (sizeof(sections) / sizeof(sections[0]))

/* ------------------------------------------------------------------------ */
/* The presets                                                              */
/* ------------------------------------------------------------------------ */

typedef struct override {
  const char *key; /* "section.name" */
  const char *value;
} override;

typedef struct preset_desc {
  const char *name;
  const char *parent;  /* NULL only for `none` */
  const override *set; /* terminated by {NULL, NULL} */
} preset_desc;

static const override none_set[] = {
    {NULL, NULL},
};

/* The seeds' mechanisms combined (DESIGN.md section 3, "default" column). */
static const override default_set[] = {
    /* A budget, not a loop signal: coding agents that succeed run 50-150
     * steps (docs/detection.md). */
    {"loop.max_iterations", "150"},
    {"loop.identical_call_limit", "5"},
    {"loop.cycle_limit", "5"},
    {"loop.max_turn_duration", "5m"},
    {"loop.final_request_without_tools", "true"},
    {"errors.max_identical_errors", "5"},
    {"errors.max_consecutive_errors", "3"},
    /* A failing test or a traceback is what the agent works on, not the
     * loop going wrong (docs/detection.md): 16 still sees its repeats. */
    {"errors.counted_failures", "malfunctions"},
    {"errors.feedback", "compact"},
    {"errors.error_context", "true"},
    {"errors.error_prefixes", "Error:"},
    {"errors.normalize_errors", "true"},
    /* Mechanisms 12-16, chosen on real runs (docs/detection.md). */
    {"loop.max_refused_replies", "10"},
    {"loop.max_denied_calls", "3"},
    {"loop.content_loop_repeats", "10"},
    {"loop.max_empty_replies", "2"},
    {"loop.repeated_result_limit", "5"},
    {"loop.repeated_failure_limit", "3"},
    {"retry.max_retries", "3"},
    {"retry.function_timeout", "30s"},
    {"network.max_retries", "3"},
    {"network.timeout", "120s"},
    {NULL, NULL},
};

/* Seeds 000 and 001. HPD's single MaxRetries is both the retry count and the
 * consecutive-error limit; agentguard has one key for each and sets both. */
static const override hpd_set[] = {
    {"errors.error_prefixes", "Error:"}, /* 000: a Result starting "Error:" */
    {"loop.identical_call_limit", "5"},
    {"errors.max_consecutive_errors", "3"},
    {"errors.failing_iteration", "all_failed"},
    {"retry.max_retries", "3"},
    {"retry.backoff", "linear"},
    {"retry.delay", "1s"},
    {"retry.function_timeout", "30s"},
    {"loop.max_turn_duration", "5m"},
    {NULL, NULL},
};

/* Seed 001, "Recommended Configurations". */
static const override development_set[] = {
    {"loop.max_turn_duration", "2m"},  {"loop.identical_call_limit", "3"},
    {"retry.max_retries", "2"},        {"errors.max_consecutive_errors", "2"},
    {"retry.function_timeout", "10s"}, {NULL, NULL},
};

static const override production_set[] = {
    {"loop.max_turn_duration", "10m"},
    {"loop.identical_call_limit", "5"},
    {"retry.max_retries", "3"},
    {"errors.max_consecutive_errors", "3"},
    {"retry.function_timeout", "60s"},
    {"retry.delay", "2s"},
    {NULL, NULL},
};

static const override long_running_set[] = {
    {"loop.max_turn_duration", "30m"},
    {"loop.identical_call_limit", "10"},
    {"retry.max_retries", "5"},
    {"errors.max_consecutive_errors", "5"},
    {"retry.function_timeout", "5m"},
    {"retry.delay", "3s"},
    {NULL, NULL},
};

/* Seed 002. */
static const override forge_set[] = {
    {"errors.max_identical_errors", "5"},
    {"loop.require_tool_call", "true"},
    {"loop.loop_breaking_tools", "task_complete,ask_question"},
    {"errors.error_context", "true"},
    {"errors.max_errors_in_context", "1"}, /* the previous iteration's error */
    /* Forge counts "no tool call" among its 5 identical errors; agentguard
     * counts refused replies apart, with the same limit. */
    {"loop.max_refused_replies", "5"},
    {NULL, NULL},
};

/* Seed 003. */
static const override twelve_factor_set[] = {
    {"errors.max_tool_errors", "3"},       {"errors.max_total_errors", "10"},
    {"errors.on_trip", "escalate"},        {"errors.feedback", "compact"},
    {"errors.max_errors_in_context", "3"}, {"errors.max_error_chars", "200"},
    {"errors.error_context", "true"},      {NULL, NULL},
};

/* Seed 004. */
static const override monadic_set[] = {
    {"errors.similar_error_limit", "3"},
    {"errors.error_history", "10"},
    {"loop.max_calls_per_turn", "20"},
    /* Monadic's network_error_handler.rb: DEFAULT_MAX_RETRIES = 5 */
    {"network.max_retries", "5"},
    {"network.delay", "1s"},
    {"network.max_delay", "30s"},
    {"network.timeout", "120s"},
    {NULL, NULL},
};

/* Microsoft.Extensions.AI's FunctionInvokingChatClient (named in 001). */
static const override meai_set[] = {
    {"loop.max_iterations", "40"},
    {"loop.final_request_without_tools", "true"},
    {"errors.max_consecutive_errors", "3"},
    {"errors.failing_iteration", "any_failed"},
    {"loop.parallel", "false"},     /* AllowConcurrentInvocation = false */
    {"errors.feedback", "generic"}, /* IncludeDetailedErrors = false */
    {NULL, NULL},
};

static const preset_desc presets[] = {
    {"default", "none", default_set},
    {"none", NULL, none_set},
    {"hpd", "none", hpd_set},
    {"development", "hpd", development_set},
    {"production", "hpd", production_set},
    {"long-running", "hpd", long_running_set},
    {"forge", "none", forge_set},
    {"twelve-factor", "none", twelve_factor_set},
    {"monadic", "none", monadic_set},
    {"meai", "none", meai_set},
};
#define N_PRESETS (sizeof(presets) / sizeof(presets[0]))

static const char *const preset_names[] = {
    "default",    "none",         "hpd",   "development",
    "production", "long-running", "forge", "twelve-factor",
    "monadic",    "meai",         NULL};
_Static_assert(sizeof(preset_names) / sizeof(preset_names[0]) == N_PRESETS + 1,
               "preset_names matches presets");

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static ag_err_t fail(ag_error_t *e, ag_err_t code, const char *fmt, ...)
    AG__PRINTF(3, 4);

static ag_err_t fail(ag_error_t *e, ag_err_t code, const char *fmt, ...) {
  char buf[AG_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return ag__set_error(e, code, -1, "%s", buf);
}

/*
 * Writes s for a message: control characters become '?', at most `max`
 * bytes (cut on a UTF-8 boundary, then "..."), and with quote set, wrapped
 * in double quotes with '"' and '\' escaped.
 */
static void show(char *dst, size_t cap, const char *s, bool quote) {
  enum { MAX = 48 };
  size_t n = strlen(s),
         len = n > MAX ? MAX - ag__utf8_incomplete_tail(s, MAX) : n;
  if (cap == 0)
    return;
  ag__buf b;
  ag__buf_init_fixed(&b, dst, cap);
  if (quote)
    ag__buf_add_cut(&b, "\"", 1);
  for (size_t i = 0; i < len && b.len + 2 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (quote && (c == '"' || c == '\\'))
      ag__buf_add_cut(&b, "\\", 1);
    char shown = (c < 0x20 || c == 0x7F) ? '?' : (char)c;
    ag__buf_add_cut(&b, &shown, 1);
  }
  if (len < n)
    ag__buf_addstr_cut(&b, "...");
  if (quote)
    ag__buf_addstr_cut(&b, "\"");
}

static int ascii_lower(int c) {
  return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}

static bool starts_with_ci(const char *s, size_t ls, const char *p, size_t lp) {
  if (lp > ls)
    return false;
  for (size_t i = 0; i < lp; i++)
    if (ascii_lower((unsigned char)s[i]) != ascii_lower((unsigned char)p[i]))
      return false;
  return true;
}

/*
 * The candidate `input` most likely meant, or NULL. A candidate qualifies by
 * edit distance (at most 1 for inputs shorter than 6 bytes, else 2; the
 * closest wins, ties go to the first) or, failing that, by being the only
 * one that extends the input (at least 3 bytes) or that the input extends
 * (candidate at least 4 bytes), as "max_iter" or "delay_ms".
 */
static const char *suggest(const char *input, const char *const *cands,
                           size_t n) {
  size_t li = strlen(input);
  int limit = ag__suggest_limit(li);
  const char *best = NULL, *prefix = NULL;
  int best_d = limit + 1, n_prefix = 0;
  for (size_t i = 0; i < n; i++) {
    size_t lc = strlen(cands[i]);
    int dist = ag__edit_distance(input, li, cands[i], lc);
    if (dist >= 0) {
      if (dist < best_d) {
        best_d = dist;
        best = cands[i];
      }
    }
    if ((li >= 3 && starts_with_ci(cands[i], lc, input, li)) ||
        (lc >= 4 && starts_with_ci(input, li, cands[i], lc))) {
      prefix = cands[i];
      n_prefix++;
    }
  }
  if (best != NULL)
    return best;
  return n_prefix == 1 ? prefix : NULL;
}

/* ------------------------------------------------------------------------ */
/* Durations                                                                */
/* ------------------------------------------------------------------------ */

enum { DUR_OK, DUR_SYNTAX, DUR_RANGE };

/*
 * "0", or digits with an optional fraction, then one unit of ms, s, m, h.
 * A fraction must come out in whole milliseconds ("1.5s" yes, "1.5ms" no).
 * DUR_RANGE for a well-formed value above DURATION_CAP_MS.
 */
static int parse_duration(const char *s, int64_t *ms) {
  if (strcmp(s, "0") == 0) {
    *ms = 0;
    return DUR_OK;
  }
  const char *p = s;
  if (*p < '0' || *p > '9')
    return DUR_SYNTAX;
  uint64_t whole = 0;
  bool big = false;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (whole > UINT64_C(1000000000000))
      big = true; /* far past the cap whatever the unit */
    else
      whole = whole * 10 + (uint64_t)(*p - '0');
  }
  /* The fraction's significant digits (trailing zeros dropped). An exact
   * fraction of any unit has at most 7 of them (3600000 = 2^7 3^2 5^5), so
   * more than 9 can be rejected before they overflow anything. */
  uint64_t frac = 0;
  int frac_digits = 0, zeros = 0;
  if (*p == '.') {
    p++;
    if (*p < '0' || *p > '9')
      return DUR_SYNTAX;
    for (; *p >= '0' && *p <= '9'; p++) {
      if (*p == '0') {
        zeros++;
        continue;
      }
      if (frac_digits + zeros + 1 > 9)
        return DUR_SYNTAX;
      for (; zeros > 0; zeros--, frac_digits++)
        frac *= 10;
      frac = frac * 10 + (uint64_t)(*p - '0');
      frac_digits++;
    }
  }
  uint64_t unit;
  if (strcmp(p, "ms") == 0)
    unit = 1;
  else if (strcmp(p, "s") == 0)
    unit = 1000;
  else if (strcmp(p, "m") == 0)
    unit = 60000;
  else if (strcmp(p, "h") == 0)
    unit = 3600000;
  else
    return DUR_SYNTAX;
  uint64_t scale = 1;
  for (int i = 0; i < frac_digits; i++)
    scale *= 10;
  if ((frac * unit) % scale != 0)
    return DUR_SYNTAX; /* not a whole number of milliseconds */
  if (big)
    return DUR_RANGE;
  uint64_t total = whole * unit + frac * unit / scale; /* < 2^62 */
  if (total > (uint64_t)DURATION_CAP_MS)
    return DUR_RANGE;
  *ms = (int64_t)total;
  return DUR_OK;
}

AG_EXTERN ag_err_t ag_parse_duration(const char *text, int64_t *ms) {
  int64_t v;
  if (text == NULL || ms == NULL || parse_duration(text, &v) != DUR_OK)
    return AG_EINVAL;
  *ms = v;
  return AG_OK;
}

AG_EXTERN void ag_format_duration(int64_t ms, char *buf, size_t cap) {
  if (buf == NULL || cap == 0)
    return;
  if (ms == 0) {
    ag__scopy(buf, cap, "0");
    return;
  }
  /* magnitude as unsigned so INT64_MIN works too */
  uint64_t m = ms < 0 ? (uint64_t)0 - (uint64_t)ms : (uint64_t)ms;
  const char *sign = ms < 0 ? "-" : "";
  const char *unit = "ms";
  if (m % 3600000 == 0)
    m /= 3600000, unit = "h";
  else if (m % 60000 == 0)
    m /= 60000, unit = "m";
  else if (m % 1000 == 0)
    m /= 1000, unit = "s";
  snprintf(buf, cap, "%s%llu%s", sign, (unsigned long long)m, unit);
}

/* ------------------------------------------------------------------------ */
/* Reading and writing fields                                               */
/* ------------------------------------------------------------------------ */

static int64_t get_num(const ag_config *c, const key_desc *k) {
  const char *p = (const char *)c + k->off;
  switch (k->kind) {
  case K_INT:
  case K_ENUM: {
    int v;
    memcpy(&v, p, sizeof(v));
    return v;
  }
  case K_BOOL:
    return (unsigned char)*p; /* the byte, so junk is detectable */
  case K_DURATION: {
    int64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
  }
  case K_LIST:
    break;
  }
  return 0;
}

static void put_num(ag_config *c, const key_desc *k, int64_t v) {
  char *p = (char *)c + k->off;
  switch (k->kind) {
  case K_INT:
  case K_ENUM: {
    int x = (int)v;
    memcpy(p, &x, sizeof(x));
    break;
  }
  case K_BOOL: {
    bool b = v != 0;
    memcpy(p, &b, sizeof(b));
    break;
  }
  case K_DURATION:
    memcpy(p, &v, sizeof(v));
    break;
  case K_LIST:
    break;
  }
}

static ag_str_list *list_at(ag_config *c, const key_desc *k) {
  return (ag_str_list *)(void *)((char *)c + k->off);
}

static const ag_str_list *clist_at(const ag_config *c, const key_desc *k) {
  return (const ag_str_list *)(const void *)((const char *)c + k->off);
}

static int enum_count(const key_desc *k) {
  int n = 0;
  while (k->enums[n] != NULL)
    n++;
  return n;
}

static int enum_index(const key_desc *k, const char *s) {
  for (int i = 0; k->enums[i] != NULL; i++)
    if (strcmp(k->enums[i], s) == 0)
      return i;
  return -1;
}

static const key_desc *find_key(const char *section, const char *name) {
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].section, section) == 0 &&
        strcmp(keys[i].name, name) == 0)
      return &keys[i];
  return NULL;
}

static const key_desc *find_key_path(const char *path) {
  const char *dot = strchr(path, '.');
  char sec[16];
  if (dot == NULL || (size_t)(dot - path) >= sizeof(sec))
    return NULL;
  memcpy(sec, path, (size_t)(dot - path));
  sec[dot - path] = '\0';
  return find_key(sec, dot + 1);
}

/* Sets a key from its text form (preset tables). False when the text does
 * not fit the key: a bug in the tables, caught by the tests. */
static bool set_text(ag_config *c, const key_desc *k, const char *text) {
  switch (k->kind) {
  case K_INT: {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || v < k->min || v > k->max)
      return false;
    put_num(c, k, v);
    return true;
  }
  case K_BOOL:
    if (strcmp(text, "true") != 0 && strcmp(text, "false") != 0)
      return false;
    put_num(c, k, strcmp(text, "true") == 0);
    return true;
  case K_DURATION: {
    int64_t ms;
    if (parse_duration(text, &ms) != DUR_OK)
      return false;
    put_num(c, k, ms);
    return true;
  }
  case K_ENUM: {
    int i = enum_index(k, text);
    if (i < 0)
      return false;
    put_num(c, k, i);
    return true;
  }
  case K_LIST: {
    ag_str_list *l = list_at(c, k);
    memset(l, 0, sizeof(*l));
    for (const char *p = text; *p != '\0';) {
      size_t n = strcspn(p, ",");
      if (n == 0 || n >= AG_LIST_ITEM_MAX || l->count >= AG_LIST_MAX)
        return false;
      memcpy(l->items[l->count++], p, n);
      p += n;
      if (*p == ',')
        p++;
    }
    return true;
  }
  }
  return false;
}

static const preset_desc *find_preset(const char *name) {
  for (size_t i = 0; i < N_PRESETS; i++)
    if (strcmp(presets[i].name, name) == 0)
      return &presets[i];
  return NULL;
}

static void build_preset(ag_config *c, const preset_desc *p) {
  const preset_desc *chain[8];
  int n = 0;
  for (const preset_desc *q = p; q != NULL && n < 8;
       q = q->parent ? find_preset(q->parent) : NULL)
    chain[n++] = q;
  memset(c, 0, sizeof(*c));
  for (size_t i = 0; i < N_KEYS; i++) {
    bool ok = set_text(c, &keys[i], keys[i].none);
    assert(ok && "bad `none` value in keys[]");
    (void)ok;
  }
  while (n-- > 0) {
    for (const override *o = chain[n]->set; o->key != NULL; o++) {
      const key_desc *k = find_key_path(o->key);
      bool ok = k != NULL && set_text(c, k, o->value);
      assert(ok && "bad override in a preset table");
      (void)ok;
    }
  }
  ag__scopy(c->preset, sizeof(c->preset), p->name);
}

/* `preset: "hdp" is not a preset; did you mean hpd?`, with the known names
 * listed when there is no suggestion or `list_always`. */
static ag_err_t preset_error(ag_error_t *e, ag_err_t code, const char *name,
                             bool list_always) {
  char shown[128], msg[AG_ERROR_MSG_MAX];
  const char *s = suggest(name, preset_names, N_PRESETS);
  show(shown, sizeof(shown), name, true);
  ag__buf m;
  ag__buf_init_fixed(&m, msg, sizeof(msg));
  ag__buf_printf_cut(&m, "preset: %s is not a preset", shown);
  if (s != NULL)
    ag__buf_printf_cut(&m, "; did you mean %s?", s);
  if (s == NULL || list_always) {
    ag__buf_addstr_cut(&m, " (known: ");
    for (size_t i = 0; i < N_PRESETS; i++) {
      ag__buf_addstr_cut(&m, i ? ", " : "");
      ag__buf_addstr_cut(&m, preset_names[i]);
    }
    ag__buf_addstr_cut(&m, ")");
  }
  return ag__set_error(e, code, -1, "%s", msg);
}

/* ------------------------------------------------------------------------ */
/* Public: presets                                                          */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_config_init(ag_config *cfg) {
  if (cfg != NULL)
    build_preset(cfg, &presets[0]);
}

AG_EXTERN ag_err_t ag_config_preset(ag_config *cfg, const char *name,
                                    ag_error_t *err) {
  if (cfg == NULL || name == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_config_preset: cfg and name must not be NULL");
  const preset_desc *p = find_preset(name);
  if (p == NULL)
    return preset_error(err, AG_ENOTFOUND, name, true);
  build_preset(cfg, p);
  ag_error_clear(err);
  return AG_OK;
}

AG_EXTERN const char *const *ag_preset_names(void) {
  return preset_names;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                               */
/* ------------------------------------------------------------------------ */

static ag_err_t validate(const ag_config *c, ag_error_t *e) {
  if (memchr(c->preset, '\0', sizeof(c->preset)) == NULL)
    return fail(e, AG_ECONFIG, "preset: longer than %d bytes",
                AG_LIST_ITEM_MAX - 1);
  if (c->preset[0] != '\0' && find_preset(c->preset) == NULL)
    return preset_error(e, AG_ECONFIG, c->preset, false);

  for (size_t i = 0; i < N_KEYS; i++) {
    const key_desc *k = &keys[i];
    int64_t v = get_num(c, k);
    char a[32], b[32];
    switch (k->kind) {
    case K_INT:
      if (v < k->min || v > k->max)
        return fail(e, AG_ECONFIG, "%s.%s: %lld is out of range (%lld..%lld)",
                    k->section, k->name, (long long)v, (long long)k->min,
                    (long long)k->max);
      break;
    case K_DURATION:
      if (v < 0 || v > DURATION_CAP_MS) {
        ag_format_duration(v, a, sizeof(a));
        ag_format_duration(DURATION_CAP_MS, b, sizeof(b));
        return fail(e, AG_ECONFIG, "%s.%s: %s is out of range (0..%s)",
                    k->section, k->name, a, b);
      }
      break;
    case K_BOOL:
      if (v > 1)
        return fail(e, AG_ECONFIG, "%s.%s: not a boolean (byte value %lld)",
                    k->section, k->name, (long long)v);
      break;
    case K_ENUM:
      if (v < 0 || v >= enum_count(k))
        return fail(e, AG_ECONFIG, "%s.%s: %lld is not a valid value (0..%d)",
                    k->section, k->name, (long long)v, enum_count(k) - 1);
      break;
    case K_LIST: {
      const ag_str_list *l = clist_at(c, k);
      if (l->count < 0 || l->count > AG_LIST_MAX)
        return fail(e, AG_ECONFIG, "%s.%s: %d entries, at most %d allowed",
                    k->section, k->name, l->count, AG_LIST_MAX);
      for (int j = 0; j < l->count; j++) {
        const char *it = l->items[j];
        const char *nul = memchr(it, '\0', AG_LIST_ITEM_MAX);
        if (nul == NULL)
          return fail(e, AG_ECONFIG, "%s.%s[%d]: longer than %d bytes",
                      k->section, k->name, j, AG_LIST_ITEM_MAX - 1);
        if (nul == it)
          return fail(e, AG_ECONFIG, "%s.%s[%d]: must not be empty", k->section,
                      k->name, j);
        if (!ag__utf8_valid(it, (size_t)(nul - it)))
          return fail(e, AG_ECONFIG, "%s.%s[%d]: not valid UTF-8", k->section,
                      k->name, j);
      }
      break;
    }
    }
  }

  /* The pattern detector looks back over the error history, so the history
   * must hold at least a full run. */
  if (c->errors.similar_error_limit > 0 &&
      c->errors.error_history < c->errors.similar_error_limit)
    return fail(e, AG_ECONFIG,
                "errors.error_history: %d is less than "
                "errors.similar_error_limit (%d)",
                c->errors.error_history, c->errors.similar_error_limit);
  /* A chunk seen once is no repetition. */
  if (c->loop.content_loop_repeats == 1)
    return fail(e, AG_ECONFIG,
                "loop.content_loop_repeats: 1 is out of range (0 turns it "
                "off, else 2..1000)");
  return AG_OK;
}

AG_EXTERN ag_err_t ag_config_validate(const ag_config *cfg, ag_error_t *err) {
  if (cfg == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_config_validate: cfg must not be NULL");
  ag_err_t rc = validate(cfg, err);
  if (rc == AG_OK)
    ag_error_clear(err);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Parsing                                                                  */
/* ------------------------------------------------------------------------ */

static ag_err_t apply_list(ag_config *c, const key_desc *k, json_t *v,
                           const char *path, ag_error_t *e) {
  if (!json_is_array(v))
    return fail(e, AG_ECONFIG, "%s: expected an array of strings, got %s", path,
                ag__json_kind(v));
  size_t n = json_array_size(v);
  if (n > AG_LIST_MAX)
    return fail(e, AG_ECONFIG, "%s: %zu entries, at most %d allowed", path, n,
                AG_LIST_MAX);
  ag_str_list l;
  memset(&l, 0, sizeof(l));
  for (size_t i = 0; i < n; i++) {
    json_t *it = json_array_get(v, i);
    if (!json_is_string(it))
      return fail(e, AG_ECONFIG, "%s[%zu]: expected a string, got %s", path, i,
                  ag__json_kind(it));
    size_t len = json_string_length(it);
    if (len == 0)
      return fail(e, AG_ECONFIG, "%s[%zu]: must not be empty", path, i);
    if (len >= AG_LIST_ITEM_MAX)
      return fail(e, AG_ECONFIG, "%s[%zu]: %zu bytes, at most %d allowed", path,
                  i, len, AG_LIST_ITEM_MAX - 1);
    memcpy(l.items[i], json_string_value(it), len);
  }
  l.count = (int)n;
  memcpy(list_at(c, k), &l, sizeof(l));
  return AG_OK;
}

static ag_err_t apply_value(ag_config *c, const key_desc *k, json_t *v,
                            const char *path, ag_error_t *e) {
  char shown[128];
  switch (k->kind) {
  case K_INT: {
    if (!json_is_integer(v))
      return fail(e, AG_ECONFIG, "%s: expected an integer, got %s", path,
                  ag__json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < k->min || x > k->max)
      return fail(e, AG_ECONFIG, "%s: %lld is out of range (%lld..%lld)", path,
                  (long long)x, (long long)k->min, (long long)k->max);
    put_num(c, k, x);
    return AG_OK;
  }
  case K_BOOL:
    if (!json_is_boolean(v))
      return fail(e, AG_ECONFIG, "%s: expected a boolean, got %s", path,
                  ag__json_kind(v));
    put_num(c, k, json_is_true(v));
    return AG_OK;
  case K_DURATION: {
    if (!json_is_string(v))
      return fail(e, AG_ECONFIG,
                  "%s: expected a duration string (e.g. \"30s\"), got %s", path,
                  ag__json_kind(v));
    int64_t ms = 0;
    int r = parse_duration(json_string_value(v), &ms);
    show(shown, sizeof(shown), json_string_value(v), true);
    if (r == DUR_SYNTAX)
      return fail(e, AG_ECONFIG,
                  "%s: %s is not a duration (use e.g. \"250ms\", \"30s\", "
                  "\"5m\")",
                  path, shown);
    if (r == DUR_RANGE)
      return fail(e, AG_ECONFIG, "%s: %s is out of range (0..168h)", path,
                  shown);
    put_num(c, k, ms);
    return AG_OK;
  }
  case K_ENUM: {
    if (!json_is_string(v))
      return fail(e, AG_ECONFIG, "%s: expected a string, got %s", path,
                  ag__json_kind(v));
    int i = enum_index(k, json_string_value(v));
    if (i < 0) {
      char names[160];
      ag__buf nb;
      ag__buf_init_fixed(&nb, names, sizeof(names));
      for (int j = 0; k->enums[j] != NULL; j++)
        ag__buf_printf_cut(&nb, "%s\"%s\"", j ? ", " : "", k->enums[j]);
      show(shown, sizeof(shown), json_string_value(v), true);
      return fail(e, AG_ECONFIG, "%s: %s is not one of %s", path, shown, names);
    }
    put_num(c, k, i);
    return AG_OK;
  }
  case K_LIST:
    return apply_list(c, k, v, path, e);
  }
  return AG_OK;
}

/* "<unknown>: unknown key; did you mean <s>?" */
static ag_err_t unknown_key(ag_error_t *e, const char *prefix, const char *key,
                            const char *const *cands, size_t n) {
  char shown[128];
  const char *s = suggest(key, cands, n);
  show(shown, sizeof(shown), key, false);
  if (s != NULL)
    return fail(e, AG_ECONFIG, "%s%s: unknown key; did you mean %s?", prefix,
                shown, s);
  return fail(e, AG_ECONFIG, "%s%s: unknown key", prefix, shown);
}

static ag_err_t apply_section(ag_config *c, const char *section, json_t *obj,
                              ag_error_t *e) {
  const char *names[N_KEYS];
  size_t n = 0;
  for (size_t i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].section, section) == 0)
      names[n++] = keys[i].name;

  if (!json_is_object(obj))
    return fail(e, AG_ECONFIG, "%s: expected an object, got %s", section,
                ag__json_kind(obj));
  const char *key;
  json_t *v;
  json_object_foreach(obj, key, v) {
    const key_desc *k = find_key(section, key);
    if (k == NULL) {
      char prefix[24];
      snprintf(prefix, sizeof(prefix), "%s.", section);
      return unknown_key(e, prefix, key, names, n);
    }
    char path[96];
    snprintf(path, sizeof(path), "%s.%s", section, k->name);
    ag_err_t rc = apply_value(c, k, v, path, e);
    if (rc != AG_OK)
      return rc;
  }
  return AG_OK;
}

/* Parses into `out`; errors in `e` without any source prefix. *located is
 * set for messages that carry no key path (JSON syntax, top level). */
static ag_err_t parse_doc(ag_config *out, const char *json, size_t len,
                          ag_error_t *e, bool *located) {
  json_error_t je;
  *located = false;
  json_t *root =
      json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
  if (root == NULL) {
    *located = true;
    if (AG__JSON_NOMEM(&je))
      return fail(e, AG_ENOMEM, "out of memory");
    /* the usual reasons a config is not JSON: another format, comments */
    size_t first = 0;
    while (first < len && (json[first] == ' ' || json[first] == '\t' ||
                           json[first] == '\r' || json[first] == '\n'))
      first++;
    size_t at = je.position > 0 ? (size_t)je.position - 1 : 0;
    const char *hint =
        first < len && json[first] != '{'
            ? " (a config is a JSON object such as {\"preset\": \"default\"}; "
              "YAML and other formats are not read)"
        : at < len && (json[at] == '/' || json[at] == '#')
            ? " (JSON has no comments)"
            : "";
    if (je.line > 0)
      fail(e, AG_EJSON, "line %d, column %d: %s%s", je.line, je.column, je.text,
           hint);
    else
      fail(e, AG_EJSON, "%s%s", je.text, hint);
    e->pos = je.position;
    e->line = je.line > 0 ? je.line : 0;
    e->column = je.column > 0 ? je.column : 0;
    return AG_EJSON;
  }

  ag_err_t rc = AG_OK;
  ag_config tmp;
  if (!json_is_object(root)) {
    *located = true;
    rc = fail(e, AG_ECONFIG, "expected an object at the top level, got %s",
              ag__json_kind(root));
    goto done;
  }

  const char *pname = "default";
  json_t *p = json_object_get(root, "preset");
  if (p != NULL) {
    if (!json_is_string(p)) {
      rc = fail(e, AG_ECONFIG, "preset: expected a string, got %s",
                ag__json_kind(p));
      goto done;
    }
    pname = json_string_value(p);
  }
  const preset_desc *pd = find_preset(pname);
  if (pd == NULL) {
    rc = preset_error(e, AG_ECONFIG, pname, false);
    goto done;
  }
  build_preset(&tmp, pd);

  static const char *const top[] = {"preset",  "loop",     "errors", "retry",
                                    "network", "provider", "proxy"};
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    /* "provider" is the model client's section, read by
     * ag_provider_config_from_json (providers.h), and "proxy" the proxy's,
     * read by `agentguard proxy`; not by the guard. */
    if (strcmp(key, "preset") == 0 || strcmp(key, "provider") == 0 ||
        strcmp(key, "proxy") == 0)
      continue;
    size_t s = 0;
    while (s < N_SECTIONS && strcmp(sections[s], key) != 0)
      s++;
    if (s == N_SECTIONS) {
      rc = unknown_key(e, "", key, top, sizeof(top) / sizeof(top[0]));
      goto done;
    }
    rc = apply_section(&tmp, sections[s], v, e);
    if (rc != AG_OK)
      goto done;
  }
  rc = validate(&tmp, e);
  if (rc == AG_OK)
    memcpy(out, &tmp, sizeof(tmp));
done:
  json_decref(root);
  return rc;
}

/* Copies `e` into `err`, with "<source>: " in front when there is a source,
 * or "config: " for messages that carry no key path. */
static ag_err_t finish(ag_error_t *err, const ag_error_t *e, const char *source,
                       bool located) {
  if (err == NULL)
    return e->code;
  *err = *e;
  const char *prefix = source != NULL ? source : located ? "config" : NULL;
  if (prefix != NULL) {
    ag__buf m;
    ag__buf_init_fixed(&m, err->msg, sizeof(err->msg));
    ag__buf_printf_cut(&m, "%s: %s", prefix, e->msg);
  }
  return e->code;
}

AG_EXTERN ag_err_t ag_config_parse(ag_config *cfg, const char *json, size_t len,
                                   ag_error_t *err) {
  if (cfg == NULL || (json == NULL && len > 0))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_config_parse: cfg and json must not be NULL");
  ag_error_t e;
  bool located;
  ag_error_clear(&e);
  ag_err_t rc = parse_doc(cfg, json == NULL ? "" : json, len, &e, &located);
  if (rc == AG_OK) {
    ag_error_clear(err);
    return AG_OK;
  }
  return finish(err, &e, NULL, located);
}

ag_err_t ag__config_parse_from(ag_config *cfg, const char *json, size_t len,
                               const char *source, ag_error_t *err) {
  ag_error_t e;
  bool located = true;
  ag_error_clear(&e);
  ag_err_t rc = parse_doc(cfg, json, len, &e, &located);
  if (rc == AG_OK) {
    ag_error_clear(err);
    return AG_OK;
  }
  return finish(err, &e, source, located);
}

ag_err_t ag__config_error_from(ag_error_t *err, const ag_error_t *e,
                               const char *source) {
  return finish(err, e, source, true);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */
/* ------------------------------------------------------------------------ */

static json_t *key_to_json(const ag_config *c, const key_desc *k) {
  int64_t v = get_num(c, k);
  char buf[32];
  switch (k->kind) {
  case K_INT:
    return json_integer(v);
  case K_BOOL:
    return json_boolean(v);
  case K_DURATION:
    ag_format_duration(v, buf, sizeof(buf));
    return json_string(buf);
  case K_ENUM:
    return json_string(k->enums[v]);
  case K_LIST: {
    const ag_str_list *l = clist_at(c, k);
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < l->count; i++) {
      if (json_array_append_new(a, json_string(l->items[i])) != 0) {
        json_decref(a);
        a = NULL;
      }
    }
    return a;
  }
  }
  return NULL;
}

AG_EXTERN ag_err_t ag_config_to_json(const ag_config *cfg, char **out,
                                     ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  if (cfg == NULL || out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_config_to_json: cfg and out must not be NULL");
  /* An invalid config (hand-filled) could not be written back faithfully:
   * an enum out of range has no name, a long list item no end. */
  ag_err_t rc = validate(cfg, err);
  if (rc != AG_OK)
    return rc;

  json_t *root = json_object();
  bool ok = root != NULL;
  if (ok && cfg->preset[0] != '\0')
    ok = json_object_set_new(root, "preset", json_string(cfg->preset)) == 0;
  for (size_t s = 0; ok && s < N_SECTIONS; s++) {
    json_t *sec = json_object();
    ok = sec != NULL && json_object_set_new(root, sections[s], sec) == 0;
    for (size_t i = 0; ok && i < N_KEYS; i++)
      if (strcmp(keys[i].section, sections[s]) == 0)
        ok = json_object_set_new(sec, keys[i].name,
                                 key_to_json(cfg, &keys[i])) == 0;
  }
  char *text = NULL;
  if (ok) {
    size_t flags = JSON_SORT_KEYS | JSON_INDENT(2);
    size_t n = json_dumpb(root, NULL, 0, flags);
    text = n > 0 ? malloc(n + 1) : NULL;
    if (text != NULL && json_dumpb(root, text, n, flags) == n) {
      text[n] = '\0';
    } else {
      free(text);
      text = NULL;
    }
  }
  json_decref(root);
  if (text == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  *out = text;
  ag_error_clear(err);
  return AG_OK;
}
