/*
 * src/providers/config.c - the "provider" section of a config file.
 *
 * An ag_provider_config owns copies of every string its
 * ag_http_provider_opts point to, so a caller can parse once, read the
 * options, copy and edit them (command-line flags) and create providers
 * from them while the config lives. Errors name the key path and never
 * echo a header's value or an "api_key" (they may be secrets).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard/providers.h"

#include "../core/internal.h"
#include "../wire/wire.h"

struct ag_provider_config {
  ag_http_provider_opts opts; /* its strings point into the fields below */
  char *kind, *base_url, *model, *api_key_env, *extra;
  char **headers; /* NULL-terminated */
  bool timeout_set;
};

static const char *const known[] = {
    "kind",      "base_url",    "model",           "api_key_env",
    "headers",   "timeout",     "connect_timeout", "idle_timeout",
    "stream",    "temperature", "max_tokens",      "parallel_tool_calls",
    "extra_body"};
#define N_KNOWN (sizeof(known) / sizeof(known[0]))

AG_EXTERN void ag_provider_config_free(ag_provider_config *c) {
  if (c == NULL)
    return;
  free(c->kind);
  free(c->base_url);
  free(c->model);
  free(c->api_key_env);
  free(c->extra);
  for (size_t i = 0; c->headers != NULL && c->headers[i] != NULL; i++)
    free(c->headers[i]);
  free(c->headers);
  free(c);
}

AG_EXTERN const ag_http_provider_opts *
ag_provider_config_opts(const ag_provider_config *c, bool *timeout_set) {
  if (timeout_set != NULL)
    *timeout_set = c != NULL && c->timeout_set;
  return c != NULL ? &c->opts : NULL;
}

static const char *suggest(const char *key) {
  size_t kl = strlen(key);
  int limit = ag__suggest_limit(kl), best_d = limit + 1;
  const char *best = NULL;
  for (size_t i = 0; i < N_KNOWN; i++) {
    int d = ag__edit_distance(key, kl, known[i], strlen(known[i]));
    if (d >= 0 && d < best_d) {
      best_d = d;
      best = known[i];
    }
  }
  return best;
}

static ag_err_t str_key(const json_t *v, const char *key, char **dst,
                        ag_error_t *err) {
  if (!json_is_string(v))
    return ag__set_error(err, AG_ECONFIG, -1, "provider.%s: expected a string",
                         key);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.%s: contains a NUL byte", key);
  free(*dst);
  *dst = ag__strdup(json_string_value(v));
  return *dst == NULL ? ag__set_error(err, AG_ENOMEM, -1, "out of memory")
                      : AG_OK;
}

static ag_err_t dur_key(const json_t *v, const char *key, int64_t *ms,
                        ag_error_t *err) {
  if (!json_is_string(v) ||
      ag_parse_duration(json_string_value(v), ms) != AG_OK)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.%s: expected a duration such as \"30s\", "
                         "\"250ms\" or \"0\" (no limit)",
                         key);
  return AG_OK;
}

static ag_err_t apply(ag_provider_config *c, const char *key, const json_t *v,
                      ag_error_t *err) {
  ag_http_provider_opts *o = &c->opts;
  if (strcmp(key, "kind") == 0) {
    ag_err_t rc = str_key(v, key, &c->kind, err);
    if (rc == AG_OK && ag__wire_named(c->kind) == NULL) {
      char kinds[128];
      ag__wire_names(kinds, sizeof kinds);
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.kind: \"%.40s\" is not a provider kind "
                           "(%s)",
                           c->kind, kinds);
    }
    return rc;
  }
  if (strcmp(key, "base_url") == 0)
    return str_key(v, key, &c->base_url, err);
  if (strcmp(key, "model") == 0)
    return str_key(v, key, &c->model, err);
  if (strcmp(key, "api_key_env") == 0)
    return str_key(v, key, &c->api_key_env, err);
  if (strcmp(key, "timeout") == 0) {
    c->timeout_set = true;
    return dur_key(v, key, &o->timeout_ms, err);
  }
  if (strcmp(key, "connect_timeout") == 0)
    return dur_key(v, key, &o->connect_timeout_ms, err);
  if (strcmp(key, "idle_timeout") == 0)
    return dur_key(v, key, &o->idle_timeout_ms, err);
  if (strcmp(key, "stream") == 0 || strcmp(key, "parallel_tool_calls") == 0) {
    if (!json_is_boolean(v))
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.%s: expected true or false", key);
    *(key[0] == 's' ? &o->stream : &o->parallel_tool_calls) = json_is_true(v);
    return AG_OK;
  }
  if (strcmp(key, "temperature") == 0) {
    if (!json_is_number(v) || json_number_value(v) < 0 ||
        json_number_value(v) > 2)
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.temperature: expected a number 0..2");
    o->temperature = json_number_value(v);
    return AG_OK;
  }
  if (strcmp(key, "max_tokens") == 0) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > 10000000)
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.max_tokens: expected an integer "
                           "0..10000000 (0: not sent)");
    o->max_tokens = (int)json_integer_value(v);
    return AG_OK;
  }
  if (strcmp(key, "extra_body") == 0) {
    if (!json_is_object(v))
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.extra_body: expected an object");
    free(c->extra);
    c->extra = json_dumps(v, JSON_COMPACT);
    return c->extra == NULL ? ag__set_error(err, AG_ENOMEM, -1, "out of memory")
                            : AG_OK;
  }
  if (strcmp(key, "headers") == 0) {
    if (!json_is_object(v))
      return ag__set_error(err, AG_ECONFIG, -1,
                           "provider.headers: expected an object of "
                           "\"Name\": \"value\" strings");
    size_t n = json_object_size(v), i = 0;
    c->headers = calloc(n + 1, sizeof(char *));
    if (c->headers == NULL)
      return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
    const char *name;
    json_t *hv;
    json_object_foreach((json_t *)v, name, hv) {
      if (!json_is_string(hv))
        return ag__set_error(err, AG_ECONFIG, -1,
                             "provider.headers.%.60s: expected a string", name);
      size_t need = strlen(name) + json_string_length(hv) + 3;
      c->headers[i] = malloc(need);
      if (c->headers[i] == NULL)
        return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
      snprintf(c->headers[i], need, "%s: %s", name, json_string_value(hv));
      i++;
    }
    return AG_OK;
  }
  if (strcmp(key, "api_key") == 0)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.api_key: API keys are not read from config "
                         "files; put the key in an environment variable and "
                         "name it in provider.api_key_env");
  const char *s = suggest(key);
  if (s != NULL)
    return ag__set_error(err, AG_ECONFIG, -1,
                         "provider.%.60s: unknown key; did you mean %s?", key,
                         s);
  return ag__set_error(err, AG_ECONFIG, -1, "provider.%.60s: unknown key", key);
}

static ag_err_t env_override(char **dst, const char *name, ag_error_t *err) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0')
    return AG_OK;
  free(*dst);
  *dst = ag__strdup(v);
  return *dst == NULL ? ag__set_error(err, AG_ENOMEM, -1, "out of memory")
                      : AG_OK;
}

AG_EXTERN ag_err_t ag_provider_config_from_json(ag_provider_config **out,
                                                const json_t *section,
                                                ag_error_t *err) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_provider_config_from_json: out is NULL");
  *out = NULL;
  if (section != NULL && !json_is_object(section))
    return ag__set_error(err, AG_ECONFIG, -1, "provider: expected an object");
  ag_provider_config *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  ag_http_provider_opts_init(&c->opts);
  ag_err_t rc = AG_OK;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)section, key, v) {
    rc = apply(c, key, v, err);
    if (rc != AG_OK)
      break;
  }
  if (rc == AG_OK)
    rc = env_override(&c->base_url, "AGENTGUARD_BASE_URL", err);
  if (rc == AG_OK)
    rc = env_override(&c->model, "AGENTGUARD_MODEL", err);
  if (rc != AG_OK) {
    ag_provider_config_free(c);
    return rc;
  }
  ag_http_provider_opts *o = &c->opts;
  if (c->kind != NULL)
    o->kind = c->kind;
  o->base_url = c->base_url;
  o->model = c->model;
  o->api_key_env = c->api_key_env;
  o->headers = (const char *const *)c->headers;
  o->extra_body_json = c->extra;
  *out = c;
  return AG_OK;
}

AG_EXTERN ag_err_t ag_provider_config_parse(ag_provider_config **out,
                                            const char *json, size_t len,
                                            ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  if (out == NULL || json == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_provider_config_parse: %s is NULL",
                         out == NULL ? "out" : "json");
  json_error_t je;
  json_t *j = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (j == NULL && AG__JSON_NOMEM(&je))
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  if (j == NULL)
    return ag__set_error(err, AG_EJSON, je.position,
                         "provider: invalid JSON at byte %d (line %d, column "
                         "%d): %s",
                         je.position, je.line, je.column, je.text);
  ag_err_t rc = ag_provider_config_from_json(out, j, err);
  json_decref(j);
  return rc;
}
