/*
 * src/exec/toolsfile.c - tools defined in JSON: one TOOL object
 * (ag_registry_add_json, shared with the scenario loader of the CLI) and a
 * tools file, {"NAME": TOOL, ...} (ag_tools_file_load). The TOOL format is
 * the scenario's (docs/scenarios.md): description, parameters (a JSON
 * Schema), requires_approval, idempotent and command (an argv array: a
 * subprocess tool that gets the arguments as JSON on stdin).
 *
 * Messages name the key path the way the scenario loader always has
 * ("tools.grep.command[1]: expected a string, got integer"; "tools.grep.
 * comand: unknown key; did you mean command?"), so a tool moved from a
 * scenario to a tools file, or back, reads the same errors.
 *
 * A tools file is all or nothing: every tool is first added to a scratch
 * registry (which checks names, schemas and argv), and only when all of
 * them pass are they added to the caller's registry; a name already there
 * is an error before anything is added.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_ARGV 256
#define MAX_FILE (4 * 1024 * 1024) /* bytes of a tools file */
#define SHOWN 48                   /* bytes of a user's key in a message */

static const char *const k_tool_keys[] = {
    "description", "parameters", "requires_approval", "idempotent", "command",
    "env",         NULL};

static bool listed(const char *key, const char *const *list) {
  for (size_t i = 0; list != NULL && list[i] != NULL; i++)
    if (strcmp(key, list[i]) == 0)
      return true;
  return false;
}

/* The closest of both lists within ag__suggest_limit, or NULL. */
static const char *near_key(const char *key, const char *const *a,
                            const char *const *b) {
  size_t lk = strlen(key);
  int best = ag__suggest_limit(lk) + 1;
  const char *near = NULL;
  const char *const *lists[2] = {a, b};
  for (int l = 0; l < 2; l++)
    for (size_t i = 0; lists[l] != NULL && lists[l][i] != NULL; i++) {
      int d = ag__edit_distance(key, lk, lists[l][i], strlen(lists[l][i]));
      if (d >= 0 && d < best) {
        best = d;
        near = lists[l][i];
      }
    }
  return near;
}

static ag_err_t check_keys(const json_t *tool, const char *path,
                           const char *const *extra, ag_error_t *err) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)tool, key, v) {
    if (listed(key, k_tool_keys) || listed(key, extra))
      continue;
    char k[SHOWN + 8];
    const char *near = near_key(key, k_tool_keys, extra);
    if (near != NULL)
      return ag__set_error(err, AG_EINVAL, -1,
                           "%s.%s: unknown key; did you mean %s?", path,
                           ag__shown(key, SHOWN, k, sizeof(k)), near);
    char list[256] = "";
    size_t used = 0;
    const char *const *lists[2] = {k_tool_keys, extra};
    for (int l = 0; l < 2; l++)
      for (size_t i = 0;
           lists[l] != NULL && lists[l][i] != NULL && used < sizeof(list); i++)
        used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%s",
                                 used ? ", " : "", lists[l][i]);
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.%s: unknown key (expected one of: %s)", path,
                         ag__shown(key, SHOWN, k, sizeof(k)), list);
  }
  return AG_OK;
}

static ag_err_t opt_bool(const json_t *tool, const char *key, const char *path,
                         bool *out, ag_error_t *err) {
  json_t *v = json_object_get(tool, key);
  if (v == NULL)
    return AG_OK;
  if (!json_is_boolean(v))
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.%s: expected true or false, got %s", path, key,
                         ag__json_kind(v));
  *out = json_is_true(v);
  return AG_OK;
}

static void free_env(char **env) {
  for (size_t i = 0; env != NULL && env[i] != NULL; i++)
    free(env[i]);
  free(env);
}

/*
 * A command tool's "env" (docs/security.md): ["NAME", ...] (passed from the
 * process's environment) or {"NAME": "value", ...} (set). *out gets a
 * NULL-terminated list of "NAME" / "NAME=value" (free_env), NULL when
 * absent.
 */
static ag_err_t load_env(const json_t *v, const char *path, char ***out,
                         ag_error_t *err) {
  *out = NULL;
  if (v == NULL)
    return AG_OK;
  if (!json_is_array(v) && !json_is_object(v))
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.env: expected an array of variable names or an "
                         "object {\"NAME\": \"value\"}, got %s",
                         path, ag__json_kind(v));
  size_t n = json_is_array(v) ? json_array_size(v) : json_object_size(v);
  if (n > AG__ENV_MAX)
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.env: at most %d variables, got %zu", path,
                         AG__ENV_MAX, n);
  char **env = calloc(n + 1, sizeof(*env));
  if (env == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  char nm[SHOWN + 8];
  size_t k = 0;
  ag_err_t rc = AG_OK;
  const char *key;
  json_t *e;
  if (json_is_array(v)) {
    for (size_t i = 0; i < n && rc == AG_OK; i++) {
      e = json_array_get(v, i);
      size_t nl;
      if (!json_is_string(e))
        rc = ag__set_error(err, AG_EINVAL, -1,
                           "%s.env[%zu]: expected a variable name, got %s",
                           path, i, ag__json_kind(e));
      else if (strchr(json_string_value(e), '=') != NULL ||
               !ag__env_entry_valid(json_string_value(e), &nl))
        rc = ag__set_error(
            err, AG_EINVAL, -1,
            "%s.env[%zu]: \"%s\" is not a variable name "
            "(letters, digits and _, not starting with a digit)",
            path, i, ag__shown(json_string_value(e), SHOWN, nm, sizeof(nm)));
      else if ((env[k++] = strdup(json_string_value(e))) == NULL)
        rc = ag__set_error(err, AG_ENOMEM, -1, "out of memory");
    }
  } else {
    json_object_foreach((json_t *)v, key, e) {
      if (rc != AG_OK)
        break;
      size_t kl = strlen(key), nl;
      if (strchr(key, '=') != NULL || !ag__env_entry_valid(key, &nl)) {
        rc = ag__set_error(err, AG_EINVAL, -1,
                           "%s.env: \"%s\" is not a variable name (letters, "
                           "digits and _, not starting with a digit)",
                           path, ag__shown(key, SHOWN, nm, sizeof(nm)));
      } else if (!json_is_string(e)) {
        rc = ag__set_error(err, AG_EINVAL, -1,
                           "%s.env.%s: expected a string value, got %s", path,
                           key, ag__json_kind(e));
      } else if (strlen(json_string_value(e)) != json_string_length(e)) {
        rc = ag__set_error(err, AG_EINVAL, -1,
                           "%s.env.%s: the value holds a NUL byte", path, key);
      } else {
        size_t vl = json_string_length(e);
        char *kv = malloc(kl + vl + 2);
        if (kv == NULL) {
          rc = ag__set_error(err, AG_ENOMEM, -1, "out of memory");
        } else {
          memcpy(kv, key, kl);
          kv[kl] = '=';
          memcpy(kv + kl + 1, json_string_value(e), vl + 1);
          env[k++] = kv;
        }
      }
    }
  }
  if (rc != AG_OK) {
    free_env(env);
    return rc;
  }
  *out = env;
  return AG_OK;
}

AG_EXTERN void ag_tool_json_opts_init(ag_tool_json_opts *o) {
  if (o != NULL)
    memset(o, 0, sizeof(*o));
}

/* What ag_registry_add_json allocates for one tool; freed in one place
 * (tool_parts_free) whatever happened. */
typedef struct tool_parts {
  char *params;      /* "parameters", compact JSON text */
  const char **argv; /* "command"; the strings are borrowed from the JSON */
  char **env;        /* "env" (free_env) */
} tool_parts;

static void tool_parts_free(tool_parts *p) {
  free(p->params);
  free(p->argv);
  free_env(p->env);
}

/* "description", "requires_approval", "idempotent", and whether the tool has
 * exactly one of "command" and an implementation (opts->fn). */
static ag_err_t load_basics(const json_t *tool, const char *path,
                            const ag_tool_json_opts *opts, ag_tool_def *def,
                            ag_error_t *err) {
  json_t *desc = json_object_get(tool, "description");
  if (desc != NULL && !json_is_string(desc))
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.description: expected a string, got %s", path,
                         ag__json_kind(desc));
  def->description = desc != NULL ? json_string_value(desc) : NULL;
  ag_err_t rc;
  if ((rc = opt_bool(tool, "requires_approval", path, &def->requires_approval,
                     err)) != AG_OK ||
      (rc = opt_bool(tool, "idempotent", path, &def->idempotent, err)) != AG_OK)
    return rc;

  json_t *cmd = json_object_get(tool, "command");
  if (cmd != NULL && opts->fn != NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s: \"command\" given for a tool that has an "
                         "implementation already",
                         path);
  if (cmd == NULL && opts->fn == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s: needs \"command\" (the program to run, as an "
                         "argv array of strings)",
                         path);
  return AG_OK;
}

/* "parameters": a JSON Schema object, kept as text in parts->params. */
static ag_err_t load_parameters(const json_t *tool, const char *path,
                                ag_tool_def *def, tool_parts *parts,
                                ag_error_t *err) {
  json_t *schema = json_object_get(tool, "parameters");
  if (schema == NULL)
    return AG_OK;
  if (!json_is_object(schema))
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.parameters: expected a JSON Schema object, "
                         "got %s",
                         path, ag__json_kind(schema));
  parts->params = json_dumps(schema, JSON_COMPACT);
  if (parts->params == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  def->parameters = parts->params;
  return AG_OK;
}

/* "command": 1 to MAX_ARGV strings without NUL bytes, into parts->argv. */
static ag_err_t load_argv(const json_t *cmd, const char *path,
                          tool_parts *parts, ag_error_t *err) {
  if (!json_is_array(cmd))
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.command: expected an array of strings (argv), "
                         "got %s",
                         path, ag__json_kind(cmd));
  size_t n = json_array_size(cmd);
  if (n == 0 || n > MAX_ARGV)
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s.command: needs 1 to %d strings (argv), got %zu",
                         path, MAX_ARGV, n);
  if ((parts->argv = calloc(n + 1, sizeof(*parts->argv))) == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_t *a = json_array_get(cmd, i);
    if (!json_is_string(a))
      return ag__set_error(err, AG_EINVAL, -1,
                           "%s.command[%zu]: expected a string, got %s", path,
                           i, ag__json_kind(a));
    if (strlen(json_string_value(a)) != json_string_length(a))
      return ag__set_error(err, AG_EINVAL, -1,
                           "%s.command[%zu]: contains a NUL character", path,
                           i);
    parts->argv[i] = json_string_value(a);
  }
  return AG_OK;
}

/* What the tool runs: a command (argv and env) or opts' implementation. */
static ag_err_t load_runner(const json_t *tool, const char *path,
                            const ag_tool_json_opts *opts, ag_tool_def *def,
                            tool_parts *parts, ag_error_t *err) {
  json_t *cmd = json_object_get(tool, "command");
  json_t *env = json_object_get(tool, "env");
  if (cmd == NULL) {
    if (env != NULL)
      return ag__set_error(err, AG_EINVAL, -1,
                           "%s.env: only a \"command\" tool has an "
                           "environment (a tool without one runs nothing)",
                           path);
    def->fn = opts->fn;
    def->user = opts->user;
    return AG_OK;
  }
  ag_err_t rc = load_argv(cmd, path, parts, err);
  if (rc == AG_OK)
    rc = load_env(env, path, &parts->env, err);
  def->argv = parts->argv;
  def->env = (const char *const *)parts->env;
  return rc;
}

AG_EXTERN ag_err_t ag_registry_add_json(ag_registry *r, const char *name,
                                        const json_t *tool,
                                        const ag_tool_json_opts *opts,
                                        ag_error_t *err) {
  if (r == NULL || name == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "tools: no registry or name");
  ag_tool_json_opts none;
  if (opts == NULL) {
    ag_tool_json_opts_init(&none);
    opts = &none;
  }
  char nm[SHOWN + 8], pbuf[SHOWN + 16];
  const char *path = opts->path;
  if (path == NULL) {
    snprintf(pbuf, sizeof(pbuf), "tools.%s",
             ag__shown(name, SHOWN, nm, sizeof(nm)));
    path = pbuf;
  }
  if (!json_is_object(tool))
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s: expected a tool object, got %s", path,
                         ag__json_kind(tool));
  ag_err_t rc = check_keys(tool, path, opts->extra_keys, err);
  if (rc != AG_OK)
    return rc;

  ag_tool_def def;
  ag_tool_def_init(&def);
  def.name = name;
  tool_parts parts = {NULL, NULL, NULL};
  rc = load_basics(tool, path, opts, &def, err);
  if (rc == AG_OK)
    rc = load_parameters(tool, path, &def, &parts, err);
  if (rc == AG_OK)
    rc = load_runner(tool, path, opts, &def, &parts, err);
  if (rc == AG_OK)
    rc = ag_registry_add(r, &def, err);
  tool_parts_free(&parts);
  return rc;
}

AG_EXTERN ag_err_t ag_tools_file_load(ag_registry *r, const char *json,
                                      size_t len, ag_error_t *err) {
  if (r == NULL || json == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "tools file: no registry or text");
  if (len > MAX_FILE)
    return ag__set_error(err, AG_ETOOBIG, -1,
                         "tools file: %zu bytes; at most %d", len, MAX_FILE);
  json_error_t jerr;
  json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (doc == NULL && AG__JSON_NOMEM(&jerr))
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  if (doc == NULL) {
    ag__set_error(err, AG_EJSON, (long)jerr.position, "line %d, column %d: %s",
                  jerr.line, jerr.column, jerr.text);
    if (err != NULL) {
      err->line = jerr.line;
      err->column = jerr.column;
    }
    return AG_EJSON;
  }
  if (!json_is_object(doc)) {
    ag__set_error(err, AG_EINVAL, -1,
                  "tools file: expected an object {\"NAME\": TOOL, ...}, got "
                  "%s",
                  ag__json_kind(doc));
    json_decref(doc);
    return AG_EINVAL;
  }
  ag_registry *scratch = NULL;
  ag_err_t rc = ag_registry_new(&scratch, err);
  const char *name;
  json_t *tool;
  if (rc == AG_OK) {
    json_object_foreach(doc, name, tool) {
      if (ag_registry_get(r, name) != NULL) {
        char nm[SHOWN + 8];
        rc = ag__set_error(err, AG_EINVAL, -1,
                           "tools.%s: a tool with this name is already "
                           "registered",
                           ag__shown(name, SHOWN, nm, sizeof(nm)));
        break;
      }
      if ((rc = ag_registry_add_json(scratch, name, tool, NULL, err)) != AG_OK)
        break;
    }
  }
  for (size_t i = 0; rc == AG_OK && i < ag_registry_count(scratch); i++) {
    const ag_tool_def *d =
        ag_registry_get(scratch, ag_registry_name(scratch, i));
    rc = ag_registry_add(r, d, err);
  }
  ag_registry_free(scratch);
  json_decref(doc);
  return rc;
}
