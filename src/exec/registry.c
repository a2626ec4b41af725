/*
 * src/exec/registry.c - the tool registry: copies tool definitions, compiles
 * their parameter schemas, finds tools by name and validates call arguments.
 *
 * Data structures. Tools live in an array of entries in insertion order
 * (ag_registry_name(i)). Each entry owns an ag__tool whose ag_tool_def points
 * into the entry's own copies of the strings and argv, so a caller's
 * definition may go away right after ag_registry_add. Lookup by name goes
 * through an open-addressing hash table of entry indices (FNV-1a, linear
 * probing, at most half full), rebuilt when the entry array grows; both grow
 * by doubling and only on add, and the number of tools is capped at MAX_TOOLS,
 * so a registry's memory is bounded by what was added.
 *
 * Threading. Adding is single-threaded. Afterwards every read (find, get,
 * validate, tools_json) only reads: no lazy caches, no static buffers. The
 * parsed schema kept for tools_json is deep-copied per call (jansson 2.14's
 * deep copy only reads its source) so a caller who edits the returned array
 * cannot reach the registry's copy.
 *
 * Rejected: a sorted array with binary search (insertion order would need a
 * second array anyway) and an intrusive hash library (nothing in Debian's
 * jansson exposes its hashtable; 40 lines here do).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_TOOLS 1024
#define MAX_NAME 64

typedef struct entry {
  ag__tool tool;
  char *name, *description, *parameters;
  size_t name_len;
  uint32_t hash;
} entry;

/* State a group of native tools shares, freed with the registry
 * (ag__registry_own). */
typedef struct owned {
  void *p;
  void (*free_fn)(void *);
  struct owned *next;
} owned;

struct ag_registry {
  entry **tools; /* insertion order */
  size_t n, cap;
  uint32_t *slots; /* entry index + 1; 0 is empty */
  size_t n_slots;  /* a power of two, at least 2 * cap */
  owned *owned;    /* freed last, newest first */
};

static uint32_t fnv1a(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 16777619u;
  }
  return h;
}

/* The registered name closest to `name` (at most 1 edit for names shorter
 * than 6 bytes, else 2; ties go to the first registered), or NULL. */
static const char *suggest_tool(const ag_registry *r, const char *name) {
  size_t li = strlen(name);
  if (li > MAX_NAME)
    return NULL;
  int best = ag__suggest_limit(li) + 1;
  const char *near = NULL;
  for (size_t i = 0; i < r->n; i++) {
    int d =
        ag__edit_distance(name, li, r->tools[i]->name, r->tools[i]->name_len);
    if (d >= 0 && d < best) {
      best = d;
      near = r->tools[i]->name;
    }
  }
  return near;
}

/* A name as shown in a message: quoted, cut to MAX_NAME bytes. */
static void quote_name(char *dst, size_t cap, const char *name) {
  size_t n = strlen(name), m = n > MAX_NAME ? ag__utf8_back(name, MAX_NAME) : n;
  snprintf(dst, cap, "\"%.*s%s\"", (int)m, name, m < n ? "..." : "");
}

AG_EXTERN void ag_tool_def_init(ag_tool_def *d) {
  if (d == NULL)
    return;
  memset(d, 0, sizeof(*d));
  d->idempotent = true;
  d->timeout_ms = -1;
  d->max_retries = -1;
  d->max_output = 0;    /* 1 MiB */
  d->kill_grace_ms = 0; /* 500 ms */
}

AG_EXTERN ag_err_t ag_registry_new(ag_registry **out, ag_error_t *err) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "registry: no output pointer");
  *out = calloc(1, sizeof(**out));
  if (*out == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  return AG_OK;
}

static void entry_free(entry *e) {
  if (e == NULL)
    return;
  ag__schema_free(e->tool.schema);
  json_decref(e->tool.parameters);
  if (e->tool.argv_copy != NULL) {
    for (char **a = e->tool.argv_copy; *a != NULL; a++)
      free(*a);
    free(e->tool.argv_copy);
  }
  if (e->tool.env_copy != NULL) {
    for (char **a = e->tool.env_copy; *a != NULL; a++)
      free(*a);
    free(e->tool.env_copy);
  }
  free(e->name);
  free(e->description);
  free(e->parameters);
  free(e);
}

AG_EXTERN void ag_registry_free(ag_registry *r) {
  if (r == NULL)
    return;
  for (size_t i = 0; i < r->n; i++)
    entry_free(r->tools[i]);
  free(r->tools);
  free(r->slots);
  while (r->owned != NULL) {
    owned *o = r->owned;
    r->owned = o->next;
    o->free_fn(o->p);
    free(o);
  }
  free(r);
}

ag_err_t ag__registry_own(ag_registry *r, void *p, void (*free_fn)(void *)) {
  owned *o = malloc(sizeof(*o));
  if (o == NULL)
    return AG_ENOMEM;
  o->p = p;
  o->free_fn = free_fn;
  o->next = r->owned;
  r->owned = o;
  return AG_OK;
}

static const entry *lookup(const ag_registry *r, const char *name, size_t len,
                           uint32_t h) {
  if (r->n_slots == 0)
    return NULL;
  size_t mask = r->n_slots - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    uint32_t s = r->slots[i];
    if (s == 0)
      return NULL;
    const entry *e = r->tools[s - 1];
    if (e->hash == h && e->name_len == len && memcmp(e->name, name, len) == 0)
      return e;
  }
}

static void slot_insert(uint32_t *slots, size_t n_slots, uint32_t h,
                        uint32_t value) {
  size_t mask = n_slots - 1;
  size_t i = h & mask;
  while (slots[i] != 0)
    i = (i + 1) & mask;
  slots[i] = value;
}

/* Makes room for one more entry (and its slot); AG_OK or AG_ENOMEM. Either
 * everything grows or nothing changes. */
static ag_err_t reserve(ag_registry *r) {
  if (r->n < r->cap)
    return AG_OK;
  size_t cap = r->cap == 0 ? 8 : r->cap * 2;
  if (cap > MAX_TOOLS)
    cap = MAX_TOOLS;
  size_t n_slots = cap * 2;
  entry **tools = realloc(r->tools, cap * sizeof(*tools));
  if (tools == NULL)
    return AG_ENOMEM;
  r->tools = tools;
  uint32_t *slots = calloc(n_slots, sizeof(*slots));
  if (slots == NULL)
    return AG_ENOMEM; /* r->tools is larger but r->cap unchanged: harmless */
  for (size_t i = 0; i < r->n; i++)
    slot_insert(slots, n_slots, r->tools[i]->hash, (uint32_t)i + 1);
  free(r->slots);
  r->slots = slots;
  r->n_slots = n_slots;
  r->cap = cap;
  return AG_OK;
}

static bool valid_name(const char *name, size_t len) {
  if (len == 0 || len > MAX_NAME)
    return false;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* Checks everything about `def` except its schema. */
static ag_err_t check_def(const ag_registry *r, const ag_tool_def *def,
                          ag_error_t *err) {
  if (def->name == NULL || def->name[0] == '\0')
    return ag__set_error(err, AG_EINVAL, -1, "tools: a tool needs a name");
  size_t len = strlen(def->name);
  if (!valid_name(def->name, len)) {
    char q[MAX_NAME + 8];
    quote_name(q, sizeof(q), def->name);
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools: invalid tool name %s: use 1 to %d of "
                         "A-Z a-z 0-9 _ -",
                         q, MAX_NAME);
  }
  const char *n = def->name;
  if (lookup(r, n, len, fnv1a(n, len)) != NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: a tool with this name is already "
                         "registered",
                         n);
  if (r->n >= MAX_TOOLS)
    return ag__set_error(err, AG_ETOOBIG, -1,
                         "tools.%s: too many tools (at most %d)", n, MAX_TOOLS);
  bool has_argv = def->argv != NULL;
  if ((def->fn != NULL) == has_argv)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: set exactly one of fn (a native tool) "
                         "and argv (a subprocess tool)",
                         n);
  if (has_argv && (def->argv[0] == NULL || def->argv[0][0] == '\0'))
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: argv is empty; argv[0] must name the "
                         "program",
                         n);
  if (def->description != NULL &&
      !ag__utf8_valid(def->description, strlen(def->description)))
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: description is not valid UTF-8", n);
  if (def->timeout_ms < -1)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: timeout_ms must be -1 or >= 0", n);
  if (def->max_retries < -1)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: max_retries must be -1 or >= 0", n);
  if (def->kill_grace_ms < 0)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: kill_grace_ms must be >= 0", n);
  if (def->limits.cpu_seconds < 0 || def->limits.address_space_bytes < 0 ||
      def->limits.open_files < 0)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: limits must be >= 0 (0: not set)", n);
  if ((def->env != NULL || def->inherit_env) && !has_argv)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools.%s: env and inherit_env are for subprocess "
                         "tools (argv)",
                         n);
  for (size_t i = 0; def->env != NULL && def->env[i] != NULL; i++) {
    if (i >= AG__ENV_MAX)
      return ag__set_error(err, AG_EINVAL, -1,
                           "tools.%s: env: more than %d variables", n,
                           AG__ENV_MAX);
    if (!ag__env_entry_valid(def->env[i], NULL)) {
      char q[MAX_NAME + 8];
      quote_name(q, sizeof(q), def->env[i]);
      return ag__set_error(err, AG_EINVAL, -1,
                           "tools.%s: env[%zu]: %s is not NAME or NAME=value "
                           "(NAME: letters, digits and _, not starting with "
                           "a digit, at most %d)",
                           n, i, q, AG__ENV_NAME_MAX);
    }
  }
  return AG_OK;
}

static bool blank(const char *s) {
  for (; *s != '\0'; s++)
    if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
      return false;
  return true;
}

/* Parses and compiles def->parameters into e (NULL or blank: any object). */
static ag_err_t load_schema(entry *e, const char *text, ag_error_t *err) {
  if (text == NULL || blank(text))
    return AG_OK;
  json_error_t je;
  e->tool.parameters = json_loads(text, JSON_REJECT_DUPLICATES, &je);
  if (e->tool.parameters == NULL) {
    if (AG__JSON_NOMEM(&je))
      return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
    ag__set_error(err, AG_ECONFIG, (long)je.position,
                  "tools.%s.parameters: line %d, column %d: %s", e->name,
                  je.line, je.column, je.text);
    if (err != NULL) {
      err->line = je.line;
      err->column = je.column;
    }
    return AG_ECONFIG;
  }
  if (!json_is_object(e->tool.parameters))
    return ag__set_error(err, AG_ECONFIG, -1,
                         "tools.%s.parameters: must be a JSON Schema object",
                         e->name);
  return ag__schema_compile(&e->tool.schema, e->tool.parameters, e->name, err);
}

/* A NULL-terminated copy of list into *dst (NULL-terminated at every step,
 * so entry_free can always release it). */
static ag_err_t copy_list(char ***dst, const char *const *list) {
  size_t n = 0;
  while (list[n] != NULL)
    n++;
  *dst = calloc(n + 1, sizeof(char *));
  if (*dst == NULL)
    return AG_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    (*dst)[i] = ag__strdup(list[i]);
    if ((*dst)[i] == NULL)
      return AG_ENOMEM;
  }
  return AG_OK;
}

static ag_err_t copy_argv(entry *e, const char *const *argv) {
  size_t n = 0;
  while (argv[n] != NULL)
    n++;
  e->tool.argv_copy = calloc(n + 1, sizeof(char *));
  if (e->tool.argv_copy == NULL)
    return AG_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    e->tool.argv_copy[i] = ag__strdup(argv[i]);
    if (e->tool.argv_copy[i] == NULL)
      return AG_ENOMEM; /* the NULL ends the list for entry_free */
  }
  return AG_OK;
}

AG_EXTERN ag_err_t ag_registry_add(ag_registry *r, const ag_tool_def *def,
                                   ag_error_t *err) {
  if (r == NULL || def == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "tools: no registry or no definition given");
  ag_err_t rc = check_def(r, def, err);
  if (rc != AG_OK)
    return rc;
  entry *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  e->tool.def = *def;
  e->name = ag__strdup(def->name);
  e->description = ag__strdup(def->description);
  e->parameters = ag__strdup(def->parameters);
  if (e->name == NULL || (def->description != NULL && !e->description) ||
      (def->parameters != NULL && !e->parameters) ||
      (def->argv != NULL && copy_argv(e, def->argv) != AG_OK) ||
      (def->env != NULL && copy_list(&e->tool.env_copy, def->env) != AG_OK)) {
    entry_free(e);
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  }
  e->name_len = strlen(e->name);
  e->hash = fnv1a(e->name, e->name_len);
  e->tool.def.name = e->name;
  e->tool.def.description = e->description;
  e->tool.def.parameters = e->parameters;
  e->tool.def.argv = (const char *const *)e->tool.argv_copy;
  e->tool.def.env = (const char *const *)e->tool.env_copy;
  rc = load_schema(e, e->parameters, err);
  if (rc == AG_OK && reserve(r) != AG_OK)
    rc = ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  if (rc != AG_OK) {
    entry_free(e);
    return rc;
  }
  r->tools[r->n] = e;
  slot_insert(r->slots, r->n_slots, e->hash, (uint32_t)r->n + 1);
  r->n++;
  return AG_OK;
}

AG_EXTERN size_t ag_registry_count(const ag_registry *r) {
  return r == NULL ? 0 : r->n;
}

AG_EXTERN const char *ag_registry_name(const ag_registry *r, size_t i) {
  if (r == NULL || i >= r->n)
    return NULL;
  return r->tools[i]->name;
}

const ag__tool *ag__registry_find(const ag_registry *r, const char *name) {
  if (r == NULL || name == NULL)
    return NULL;
  size_t len = strlen(name);
  const entry *e = lookup(r, name, len, fnv1a(name, len));
  return e == NULL ? NULL : &e->tool;
}

AG_EXTERN const ag_tool_def *ag_registry_get(const ag_registry *r,
                                             const char *name) {
  const ag__tool *t = ag__registry_find(r, name);
  return t == NULL ? NULL : &t->def;
}

AG_EXTERN ag_err_t ag_registry_validate(const ag_registry *r, const char *name,
                                        const json_t *args, ag_error_t *err) {
  if (r == NULL || name == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "no registry or no tool name");
  const ag__tool *t = ag__registry_find(r, name);
  if (t == NULL) {
    char q[MAX_NAME + 8];
    quote_name(q, sizeof(q), name);
    const char *near = suggest_tool(r, name);
    if (near != NULL)
      return ag__set_error(err, AG_ENOTFOUND, -1,
                           "unknown tool %s; did you mean \"%s\"?", q, near);
    return ag__set_error(err, AG_ENOTFOUND, -1, "unknown tool %s", q);
  }
  if (args == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "expected object, got nothing");
  if (!json_is_object(args))
    return ag__set_error(err, AG_EINVAL, -1, "expected object, got %s",
                         ag__json_kind(args));
  return ag__schema_validate(t->schema, args, err);
}

/* {"type": "function", "function": {name, description?, parameters}} */
static json_t *tool_json(const entry *e) {
  json_t *params;
  if (e->tool.parameters != NULL) {
    params = json_deep_copy(e->tool.parameters);
    /* OpenAI wants a top-level "type": "object"; arguments always are. */
    if (params != NULL && json_object_get(params, "type") == NULL &&
        json_object_set_new(params, "type", json_string("object")) != 0) {
      json_decref(params);
      params = NULL;
    }
  } else {
    params = json_pack("{s:s}", "type", "object");
  }
  if (params == NULL)
    return NULL;
  json_t *fn = json_pack("{s:s, s:o}", "name", e->name, "parameters", params);
  if (fn == NULL)
    return NULL; /* json_pack's "o" stole params even on failure */
  if (e->description != NULL &&
      json_object_set_new(fn, "description", json_string(e->description)) !=
          0) {
    json_decref(fn);
    return NULL;
  }
  return json_pack("{s:s, s:o}", "type", "function", "function", fn);
}

AG_EXTERN json_t *ag_registry_tools_json(const ag_registry *r) {
  json_t *arr = json_array();
  if (arr == NULL || r == NULL)
    return arr;
  for (size_t i = 0; i < r->n; i++) {
    if (json_array_append_new(arr, tool_json(r->tools[i])) != 0) {
      json_decref(arr);
      return NULL;
    }
  }
  return arr;
}
