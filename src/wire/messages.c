/*
 * src/wire/messages.c - the Anthropic Messages shape.
 *
 * The loop keeps its history as Chat Completions messages; this file
 * converts it for every request:
 *   - system messages leave the list and become the top-level "system"
 *     (joined by a blank line);
 *   - user text becomes a text block; assistant text a text block and each
 *     tool call a tool_use block whose input is the call's arguments parsed
 *     (arguments that are not a JSON object, which the loop has already
 *     answered with a validation error, are sent as {} so that the request
 *     stays valid);
 *   - a tool message becomes a tool_result block in a user message, with
 *     is_error when the message says "is_error": true or its text is one of
 *     the loop's error forms ("<error>" compact records, "Error...",
 *     "Tool call rejected: ...");
 *   - consecutive messages of one role are merged into one message, which
 *     merges consecutive tool results (and the error context that follows
 *     them) into one user message as the API requires;
 *   - empty text is dropped (the API refuses empty text blocks).
 * Replies and stream events fill the shared assembler (reply.c); tool_use
 * blocks are calls, their input (whole, or joined from input_json_delta
 * fragments) the arguments text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#define ANTHROPIC_DEFAULT_MAX_TOKENS 4096

static bool set_new(json_t *o, const char *k, json_t *v) {
  return v != NULL && json_object_set_new(o, k, v) == 0;
}

/* The text of a message's content: a string, or the text parts of an
 * array. Returns a new string value or NULL (no text). */
static json_t *content_text(const json_t *content) {
  /* Copied: the history is borrowed, and even a reference count is a
   * change a caller sharing it between threads would not expect. The text
   * is a jansson string already (valid UTF-8): no second check. */
  if (json_is_string(content))
    return json_string_length(content) > 0
               ? json_stringn_nocheck(json_string_value(content),
                                      json_string_length(content))
               : NULL;
  if (!json_is_array(content))
    return NULL;
  size_t i;
  json_t *part;
  char *acc = NULL;
  size_t len = 0;
  json_array_foreach(content, i, part) {
    size_t l = 0;
    const char *t = ag__jstr(part, "text", &l);
    if (t == NULL || l == 0)
      continue;
    char *g = realloc(acc, len + l + 2);
    if (g == NULL) {
      free(acc);
      return NULL;
    }
    acc = g;
    if (len > 0)
      acc[len++] = '\n';
    memcpy(acc + len, t, l);
    len += l;
    acc[len] = '\0';
  }
  if (acc == NULL)
    return NULL;
  json_t *s = json_stringn_nocheck(acc, len);
  free(acc);
  return s;
}

static bool looks_like_error(const char *t) {
  return strncmp(t, "<error>", 7) == 0 || strncmp(t, "Error", 5) == 0 ||
         strncmp(t, "Tool call rejected", 18) == 0;
}

/* Appends blocks to the last message when it has `role`, else starts one. */
static bool push_blocks(json_t *msgs, const char *role, json_t *blocks) {
  if (json_array_size(blocks) == 0) {
    json_decref(blocks);
    return true;
  }
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  const char *lr = ag__jstr(last, "role", NULL);
  if (lr != NULL && strcmp(lr, role) == 0) {
    bool ok = json_array_extend(json_object_get(last, "content"), blocks) == 0;
    json_decref(blocks);
    return ok;
  }
  json_t *m = json_pack("{s:s, s:o}", "role", role, "content", blocks);
  return m != NULL && json_array_append_new(msgs, m) == 0;
}

static json_t *text_block(json_t *text) {
  return json_pack("{s:s, s:o}", "type", "text", "text", text);
}

static bool convert(const json_t *in, json_t *msgs, char **system,
                    size_t *system_len, char *msg, size_t cap) {
  size_t i;
  json_t *m;
  json_array_foreach(in, i, m) {
    const char *role = ag__jstr(m, "role", NULL);
    if (role == NULL) {
      snprintf(msg, cap, "messages[%zu].role: expected a string", i);
      return false;
    }
    json_t *content = json_object_get(m, "content");
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
      json_t *t = content_text(content);
      if (t == NULL)
        continue;
      size_t l = json_string_length(t);
      char *g = realloc(*system, *system_len + l + 3);
      if (g == NULL) {
        json_decref(t);
        return false;
      }
      *system = g;
      if (*system_len > 0) {
        memcpy(g + *system_len, "\n\n", 2);
        *system_len += 2;
      }
      memcpy(g + *system_len, json_string_value(t), l);
      *system_len += l;
      g[*system_len] = '\0';
      json_decref(t);
      continue;
    }
    json_t *blocks = json_array();
    if (blocks == NULL)
      return false;
    const char *target;
    if (strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0) {
      target = role;
      json_t *t = content_text(content);
      if (t != NULL && json_array_append_new(blocks, text_block(t)) != 0) {
        json_decref(blocks);
        return false;
      }
      size_t k;
      json_t *tc;
      json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
        json_t *fn = json_object_get(tc, "function");
        const char *name = ag__jstr(fn, "name", NULL);
        const char *id = ag__jstr(tc, "id", NULL);
        if (name == NULL || id == NULL) {
          json_decref(blocks);
          snprintf(msg, cap,
                   "messages[%zu].tool_calls[%zu]: needs an id and a "
                   "function name",
                   i, k);
          return false;
        }
        size_t al = 0;
        const char *args = ag__jstr(fn, "arguments", &al);
        json_t *input = args != NULL ? json_loadb(args, al, 0, NULL) : NULL;
        if (!json_is_object(input)) {
          json_decref(input);
          input = json_object();
        }
        json_t *b = json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
                              id, "name", name, "input", input);
        if (b == NULL || json_array_append_new(blocks, b) != 0) {
          json_decref(blocks);
          return false;
        }
      }
    } else if (strcmp(role, "tool") == 0) {
      target = "user";
      const char *id = ag__jstr(m, "tool_call_id", NULL);
      if (id == NULL) {
        json_decref(blocks);
        snprintf(msg, cap, "messages[%zu].tool_call_id: expected a string", i);
        return false;
      }
      json_t *t = content_text(content);
      const char *tv = t != NULL ? json_string_value(t) : "";
      bool is_error =
          json_is_true(json_object_get(m, "is_error")) || looks_like_error(tv);
      json_t *b = json_pack(
          "{s:s, s:s, s:o, s:b}", "type", "tool_result", "tool_use_id", id,
          "content", t != NULL ? t : json_string(""), "is_error", is_error);
      if (b == NULL || json_array_append_new(blocks, b) != 0) {
        json_decref(blocks);
        return false;
      }
    } else {
      json_decref(blocks);
      snprintf(msg, cap, "messages[%zu].role: \"%.32s\" is not a chat role", i,
               role);
      return false;
    }
    if (!push_blocks(msgs, target, blocks))
      return false;
  }
  return true;
}

static json_t *convert_tools(const json_t *tools) {
  json_t *out = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    const char *name = ag__jstr(fn, "name", NULL);
    if (name == NULL)
      continue;
    json_t *params = json_object_get(fn, "parameters");
    json_t *schema = json_is_object(params)
                         ? json_deep_copy(params)
                         : json_pack("{s:s}", "type", "object");
    /* "o" steals `schema`, even when json_pack fails. */
    json_t *o = json_pack("{s:s, s:o}", "name", name, "input_schema", schema);
    const char *d = ag__jstr(fn, "description", NULL);
    if (o == NULL ||
        (d != NULL && !set_new(o, "description", json_string(d))) ||
        json_array_append_new(out, o) != 0) {
      json_decref(out);
      return NULL;
    }
  }
  return out;
}

char *ag__anthropic_request(const ag__wire_opts *o, const ag_request *req,
                            size_t *len, ag_err_t *rc, char *msg, size_t cap) {
  *rc = AG_ENOMEM;
  /* Messages as text (the agent loop's): parsed here, for this request. */
  json_t *parsed = NULL;
  const json_t *messages = req->messages;
  if (messages == NULL && req->messages_json != NULL) {
    json_error_t jerr;
    parsed = json_loadb(req->messages_json, req->messages_json_len,
                        JSON_ALLOW_NUL, &jerr);
    if (parsed == NULL && json_error_code(&jerr) == json_error_out_of_memory)
      return NULL;
    messages = parsed;
  }
  if (!json_is_array(messages)) {
    json_decref(parsed);
    *rc = AG_EINVAL;
    snprintf(msg, cap, "messages: expected an array (or its JSON text)");
    return NULL;
  }
  json_t *body = json_object();
  json_t *msgs = json_array();
  char *system = NULL;
  size_t system_len = 0;
  char *text = NULL;
  msg[0] = '\0';
  if (body == NULL || msgs == NULL)
    goto done;
  if (!convert(messages, msgs, &system, &system_len, msg, cap)) {
    if (msg[0] != '\0')
      *rc = AG_EINVAL;
    goto done;
  }
  bool ok =
      set_new(body, "model", json_string(o->model)) &&
      set_new(body, "max_tokens",
              json_integer(o->max_tokens > 0 ? o->max_tokens
                                             : ANTHROPIC_DEFAULT_MAX_TOKENS));
  if (ok && system != NULL)
    ok = set_new(body, "system", json_stringn_nocheck(system, system_len));
  if (ok) {
    ok = json_object_set(body, "messages", msgs) == 0 &&
         set_new(body, "stream", json_boolean(o->stream));
  }
  if (ok && json_is_array(req->tools) && json_array_size(req->tools) > 0) {
    ok = set_new(body, "tools", convert_tools(req->tools)) &&
         set_new(body, "tool_choice",
                 json_pack("{s:s, s:b}", "type", "auto",
                           "disable_parallel_tool_use",
                           !o->parallel_tool_calls));
  }
  if (ok && o->temperature >= 0)
    ok = set_new(body, "temperature", json_real(o->temperature));
  if (ok && o->extra_body != NULL)
    ok = json_object_update(body, (json_t *)o->extra_body) == 0;
  if (ok) {
    text = json_dumps(body, JSON_COMPACT);
    if (text != NULL) {
      *len = strlen(text);
      *rc = AG_OK;
    }
  }
done:
  json_decref(parsed);
  free(system);
  json_decref(msgs);
  json_decref(body);
  return text;
}

static void read_usage(ag__asm *a, const json_t *u) {
  if (!json_is_object(u))
    return;
  json_t *in = json_object_get(u, "input_tokens");
  json_t *out = json_object_get(u, "output_tokens");
  json_t *cc = json_object_get(u, "cache_creation_input_tokens");
  json_t *cr = json_object_get(u, "cache_read_input_tokens");
  if (json_is_integer(in) || json_is_integer(cc) || json_is_integer(cr)) {
    a->usage.prompt_tokens =
        (json_is_integer(in) ? json_integer_value(in) : 0) +
        (json_is_integer(cc) ? json_integer_value(cc) : 0) +
        (json_is_integer(cr) ? json_integer_value(cr) : 0);
    a->usage.cached_tokens = json_is_integer(cr) ? json_integer_value(cr) : 0;
    a->has_usage = true;
  }
  if (json_is_integer(out)) {
    a->usage.completion_tokens = json_integer_value(out);
    a->has_usage = true;
  }
}

static void read_stop(ag__asm *a, const json_t *o) {
  const char *sr = ag__jstr(o, "stop_reason", NULL);
  if (sr != NULL)
    snprintf(a->finish_reason, sizeof(a->finish_reason), "%s", sr);
}

/* A tool_use block whose input came whole. */
static bool whole_input(ag__asm *a, ag__part_call *c, const json_t *input) {
  if (input == NULL || (json_is_object(input) && json_object_size(input) == 0))
    return true;
  if (!json_is_object(input))
    return ag__asm_bad(a, -1, "a tool_use input is not an object");
  char *t = json_dumps(input, JSON_COMPACT);
  if (t == NULL)
    return ag__asm_bad(a, -1, "a tool_use input could not be written");
  bool ok = ag__asm_args(a, c, t, strlen(t));
  free(t);
  return ok;
}

static bool tool_use(ag__asm *a, const json_t *b, int64_t index,
                     bool with_input) {
  ag__part_call *c = ag__asm_call(a, index);
  if (c == NULL)
    return false;
  size_t l;
  const char *id = ag__jstr(b, "id", &l);
  if (id != NULL && !ag__asm_set(a, &c->id, id, l))
    return false;
  const char *name = ag__jstr(b, "name", &l);
  if (name == NULL)
    return ag__asm_bad(a, -1, "a tool_use block has no name");
  if (!ag__asm_set(a, &c->name, name, l))
    return false;
  return !with_input || whole_input(a, c, json_object_get(b, "input"));
}

/* Whether tool_use input token in (absent: none) is what whole_input
 * takes without a word and what jansson would write of it: an empty
 * object, or one whose source text is already jansson's compact text
 * (ag__jcs_as_jansson_writes; *start and *n its span). */
static bool input_as_written(const ag__wtape *t, size_t in, size_t *start,
                             size_t *n) {
  *n = 0;
  if (in == 0 ||
      (ag__wt_is(t, in, AG__JT_OBJ) && ag__jcs_tok_next(t->j, in) == in + 1))
    return true;
  if (!ag__wt_is(t, in, AG__JT_OBJ))
    return false;
  *n = ag__jcs_member_span(t->j, in - 1, start); /* in - 1: its key */
  return ag__jcs_as_jansson_writes(t->j, in, t->s + *start, *n);
}

/* Whether content token c is what the tree path reads without a word: an
 * array of objects with a string "type"; a "text" block's "text" a
 * string; a "tool_use" block's "name" a string, its input as
 * input_as_written says. */
static bool blocks_plain(const ag__wtape *t, size_t c) {
  if (!ag__wt_is(t, c, AG__JT_ARR))
    return false;
  AG__WT_EACH(t, c, b) {
    size_t bt = ag__wt_get(t, b, "type"), start, n;
    if (!ag__wt_is(t, b, AG__JT_OBJ) || !ag__wt_is(t, bt, AG__JT_STR))
      return false;
    if (ag__wt_eq(t, bt, "text") &&
        !ag__wt_is(t, ag__wt_get(t, b, "text"), AG__JT_STR))
      return false;
    if (ag__wt_eq(t, bt, "tool_use") &&
        (!ag__wt_is(t, ag__wt_get(t, b, "name"), AG__JT_STR) ||
         !input_as_written(t, ag__wt_get(t, b, "input"), &start, &n)))
      return false;
  }
  return true;
}

/* read_usage from the tape. */
static void tape_usage(ag__asm *a, const ag__wtape *t, size_t u) {
  long long in = 0, out = 0, cc = 0, cr = 0;
  if (!ag__wt_is(t, u, AG__JT_OBJ))
    return;
  bool has_in = ag__wt_int(t, ag__wt_get(t, u, "input_tokens"), &in);
  bool has_out = ag__wt_int(t, ag__wt_get(t, u, "output_tokens"), &out);
  bool has_cc =
      ag__wt_int(t, ag__wt_get(t, u, "cache_creation_input_tokens"), &cc);
  bool has_cr = ag__wt_int(t, ag__wt_get(t, u, "cache_read_input_tokens"), &cr);
  if (has_in || has_cc || has_cr) {
    a->usage.prompt_tokens =
        (has_in ? in : 0) + (has_cc ? cc : 0) + (has_cr ? cr : 0);
    a->usage.cached_tokens = has_cr ? cr : 0;
    a->has_usage = true;
  }
  if (has_out) {
    a->usage.completion_tokens = out;
    a->has_usage = true;
  }
}

/* A whole Messages reply read from the tape (a->ct) instead of a jansson
 * tree, as chat.c's whole_tape reads a chat.completion: only a body the
 * tree path reads without a complaint - an object whose "type" is not
 * "error", its "content" as blocks_plain says - that jansson would take,
 * fed to the assembler in the tree path's steps and order. Anything else
 * returns false untouched, for the tree path, the reference
 * (ag_proxy_read_whole; test_proxy_replies and fuzz_relay compare). */
static bool whole_tape(ag__asm *a, const char *body, size_t len) {
  ag__wtape tw, *t = &tw;
  if (!ag__chunk_tape_whole(a->ct, body, len, t))
    return false;
  size_t content = ag__wt_get(t, 0, "content");
  if (ag__wt_eq(t, ag__wt_get(t, 0, "type"), "error") ||
      !blocks_plain(t, content))
    return false;
  int64_t n_calls = 0;
  size_t l;
  const char *s;
  AG__WT_EACH(t, content, b) {
    size_t bt = ag__wt_get(t, b, "type");
    if (ag__wt_eq(t, bt, "text")) {
      if ((s = ag__wt_str(t, ag__wt_get(t, b, "text"), &l)) == NULL ||
          !ag__asm_text(a, s, l))
        return ag__wt_full(a, s);
    } else if (ag__wt_eq(t, bt, "tool_use")) {
      ag__part_call *c = ag__asm_call(a, n_calls++);
      if (c == NULL)
        return true;
      size_t id = ag__wt_get(t, b, "id"), start = 0, n;
      if (ag__wt_is(t, id, AG__JT_STR) &&
          ((s = ag__wt_str(t, id, &l)) == NULL ||
           !ag__asm_set(a, &c->id, s, l)))
        return ag__wt_full(a, s);
      if ((s = ag__wt_str(t, ag__wt_get(t, b, "name"), &l)) == NULL ||
          !ag__asm_set(a, &c->name, s, l))
        return ag__wt_full(a, s);
      (void)input_as_written(t, ag__wt_get(t, b, "input"), &start, &n);
      if (n > 0 && !ag__asm_args(a, c, body + start, n))
        return true;
    }
  }
  if ((s = ag__wt_str(t, ag__wt_get(t, 0, "stop_reason"), &l)) != NULL)
    ag__asm_finish_reason(a, s, l);
  tape_usage(a, t, ag__wt_get(t, 0, "usage"));
  a->done = true;
  return true;
}

void ag__anthropic_response(ag__asm *a, const char *body, size_t len) {
  if (whole_tape(a, body, len))
    return;
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  if (j == NULL) {
    ag__asm_bad(a, (long)je.position, "not JSON (%s)", je.text);
    return;
  }
  const char *type = ag__jstr(j, "type", NULL);
  if (type != NULL && strcmp(type, "error") == 0) {
    ag__asm_stream_error(a, json_object_get(j, "error"));
    goto done;
  }
  json_t *content = json_object_get(j, "content");
  if (!json_is_array(content)) {
    ag__asm_bad(a, -1, "no \"content\" array");
    goto done;
  }
  size_t i;
  json_t *b;
  int64_t n_calls = 0;
  json_array_foreach(content, i, b) {
    const char *bt = ag__jstr(b, "type", NULL);
    if (bt == NULL) {
      ag__asm_bad(a, -1, "content[%zu] has no type", i);
      goto done;
    }
    if (strcmp(bt, "text") == 0) {
      size_t l;
      const char *t = ag__jstr(b, "text", &l);
      if (t == NULL) {
        ag__asm_bad(a, -1, "content[%zu].text is not a string", i);
        goto done;
      }
      if (!ag__asm_text(a, t, l))
        goto done;
    } else if (strcmp(bt, "tool_use") == 0) {
      if (!tool_use(a, b, n_calls++, true))
        goto done;
    }
    /* thinking and other blocks: not part of the reply the loop uses */
  }
  read_stop(a, j);
  read_usage(a, json_object_get(j, "usage"));
  a->done = true;
done:
  json_decref(j);
}

int ag__anthropic_event(ag__asm *a, const char *event, const char *data,
                        size_t len, size_t pos) {
  json_error_t je;
  json_t *j = json_loadb(data, len, 0, &je);
  if (j == NULL) {
    /* The data begins after "event: <name>\ndata: ". */
    size_t at = pos + (event[0] != '\0' ? strlen(event) + 8 : 0) + 6;
    ag__asm_bad(a, (long)(at + (size_t)je.position),
                "a stream event is not JSON (%s)", je.text);
    return 1;
  }
  bool ok = true;
  const char *type = ag__jstr(j, "type", NULL);
  if (type == NULL)
    type = event;
  json_t *ix = json_object_get(j, "index");
  int64_t index = json_is_integer(ix) ? json_integer_value(ix) : -1;
  if (strcmp(type, "message_start") == 0) {
    read_usage(a, json_object_get(json_object_get(j, "message"), "usage"));
  } else if (strcmp(type, "content_block_start") == 0) {
    json_t *b = json_object_get(j, "content_block");
    const char *bt = ag__jstr(b, "type", NULL);
    if (bt != NULL && strcmp(bt, "tool_use") == 0) {
      ok = tool_use(a, b, index, true);
    } else if (bt != NULL && strcmp(bt, "text") == 0) {
      size_t l;
      const char *t = ag__jstr(b, "text", &l);
      if (t != NULL && l > 0)
        ok = ag__asm_text(a, t, l);
    }
  } else if (strcmp(type, "content_block_delta") == 0) {
    json_t *d = json_object_get(j, "delta");
    const char *dt = ag__jstr(d, "type", NULL);
    size_t l;
    if (dt != NULL && strcmp(dt, "text_delta") == 0) {
      const char *t = ag__jstr(d, "text", &l);
      if (t != NULL)
        ok = ag__asm_text(a, t, l);
    } else if (dt != NULL && strcmp(dt, "input_json_delta") == 0) {
      const char *t = ag__jstr(d, "partial_json", &l);
      if (index < 0 || index >= a->n_slots || !a->calls[index].used ||
          a->calls[index].name == NULL) {
        ok = ag__asm_bad(a, (long)pos,
                         "input_json_delta for block %lld, which is not a "
                         "tool_use block",
                         (long long)index);
      } else if (t != NULL) {
        ok = ag__asm_args(a, &a->calls[index], t, l);
      }
    }
  } else if (strcmp(type, "message_delta") == 0) {
    read_stop(a, json_object_get(j, "delta"));
    read_usage(a, json_object_get(j, "usage"));
  } else if (strcmp(type, "message_stop") == 0) {
    a->done = true;
  } else if (strcmp(type, "error") == 0) {
    ok = ag__asm_stream_error(a, json_object_get(j, "error"));
  }
  /* ping, content_block_stop and future events: nothing to do */
  json_decref(j);
  return ok ? 0 : 1;
}

json_t *ag__blocks_text(const json_t *content) {
  if (json_is_string(content))
    return json_incref((json_t *)content);
  char *acc = NULL;
  size_t len = 0, i;
  json_t *b;
  json_array_foreach(content, i, b) {
    size_t l = 0;
    const char *t = ag__jstr(b, "text", &l);
    if (t == NULL)
      continue;
    char *g = realloc(acc, len + l + 2);
    if (g == NULL) {
      free(acc);
      return NULL;
    }
    acc = g;
    if (len > 0)
      acc[len++] = '\n';
    memcpy(acc + len, t, l);
    len += l;
  }
  json_t *out = json_stringn(acc != NULL ? acc : "", len);
  free(acc);
  return out;
}

/* The last user message with text (a string, or a text block): where the
 * turn starts; a user message of tool results only does not start one. */
static size_t messages_turn_start(const json_t *msgs) {
  for (size_t i = json_array_size(msgs); i-- > 0;) {
    const json_t *m = json_array_get(msgs, i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (role == NULL || strcmp(role, "user") != 0)
      continue;
    const json_t *content = json_object_get(m, "content");
    if (json_is_string(content))
      return i;
    size_t k;
    const json_t *b;
    json_array_foreach(content, k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      if (bt != NULL && strcmp(bt, "text") == 0)
        return i;
    }
  }
  return SIZE_MAX;
}

/*
 * Messages as Chat Completions messages (ag__wire.to_chat): a tool_use
 * block is a tool call (its input the arguments), a tool_result block a
 * tool message (is_error kept), text blocks the message's text. A user
 * message holding only tool results is no user message: it does not start
 * a turn. A "system" message inside the list (Claude Code sends them) is
 * context: left out, it neither starts a turn nor comes between two calls.
 * Other block types (thinking, images, server tools, ...) carry no call
 * and no text the guard reads. Every message is checked; only msgs[from..]
 * are converted (from = SIZE_MAX: none, the check alone). NULL with emsg
 * set on a bad shape; NULL with emsg "" when out of memory.
 */
static json_t *messages_to_chat(const json_t *msgs, size_t from, char *emsg,
                                size_t cap) {
  emsg[0] = '\0';
  json_t *out = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (out == NULL)
      return NULL;
    const bool build = i >= from;
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *content = json_object_get(m, "content");
    if (role != NULL && strcmp(role, "system") == 0)
      continue; /* context (see above) */
    if (role == NULL ||
        (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0)) {
      snprintf(emsg, cap,
               "messages[%zu].role: expected user, assistant or system", i);
      goto bad;
    }
    if (!json_is_string(content) && !json_is_array(content)) {
      snprintf(emsg, cap,
               "messages[%zu].content: expected a string or an array of "
               "content blocks",
               i);
      goto bad;
    }
    bool has_text = json_is_string(content);
    json_t *calls = build ? json_array() : NULL;
    size_t k;
    json_t *b;
    json_array_foreach(content, k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      if (bt == NULL) {
        json_decref(calls);
        snprintf(emsg, cap,
                 "messages[%zu].content[%zu].type: expected a "
                 "string",
                 i, k);
        goto bad;
      }
      if (strcmp(bt, "text") == 0) {
        has_text = true;
      } else if (strcmp(bt, "tool_use") == 0) {
        const char *id = json_string_value(json_object_get(b, "id"));
        const char *name = json_string_value(json_object_get(b, "name"));
        json_t *input = json_object_get(b, "input");
        if (id == NULL || name == NULL) {
          json_decref(calls);
          snprintf(emsg, cap,
                   "messages[%zu].content[%zu]: a tool_use block needs an id "
                   "and a name",
                   i, k);
          goto bad;
        }
        if (!build)
          continue;
        char *args = input != NULL
                         ? json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY)
                         : ag__strdup("{}");
        json_array_append_new(
            calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                             "function", "function", "name", name, "arguments",
                             args != NULL ? args : "{}"));
        free(args);
      } else if (strcmp(bt, "tool_result") == 0) {
        const char *id = json_string_value(json_object_get(b, "tool_use_id"));
        if (id == NULL) {
          json_decref(calls);
          snprintf(emsg, cap,
                   "messages[%zu].content[%zu]: a tool_result block needs a "
                   "tool_use_id",
                   i, k);
          goto bad;
        }
        if (!build)
          continue;
        json_t *t = ag__blocks_text(json_object_get(b, "content"));
        json_array_append_new(
            out, json_pack("{s:s, s:s, s:o, s:b}", "role", "tool",
                           "tool_call_id", id, "content",
                           t != NULL ? t : json_string(""), "is_error",
                           json_is_true(json_object_get(b, "is_error"))));
      }
    }
    if (!build) {
      /* checked only */
    } else if (strcmp(role, "assistant") == 0) {
      json_t *t = ag__blocks_text(content);
      json_t *am = json_pack("{s:s, s:o}", "role", "assistant", "content",
                             t != NULL ? t : json_string(""));
      if (json_array_size(calls) > 0)
        json_object_set(am, "tool_calls", calls);
      json_array_append_new(out, am);
    } else if (has_text) {
      json_t *t = ag__blocks_text(content);
      json_array_append_new(out,
                            json_pack("{s:s, s:o}", "role", "user", "content",
                                      t != NULL ? t : json_string("")));
    }
    json_decref(calls);
  }
  return out;
bad:
  json_decref(out);
  return NULL;
}

/* Whether a list of messages is in this shape: a content block of a tool
 * call or result (other transcripts may be either shape: read as chat). */
static bool messages_looks_like(const json_t *msgs) {
  size_t i, k;
  const json_t *m, *b;
  json_array_foreach(msgs, i, m) {
    json_array_foreach(json_object_get(m, "content"), k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      if (bt != NULL &&
          (strcmp(bt, "tool_use") == 0 || strcmp(bt, "tool_result") == 0))
        return true;
    }
  }
  return false;
}

/* /v1/messages, and Claude on Vertex AI: .../publishers/anthropic/models/
 * {model}:rawPredict and :streamRawPredict, which take a Messages body
 * (the model in the path, "anthropic_version" in the body). */
static bool messages_serves(const char *path) {
  if (ag__wire_path_is(path, "/v1/messages"))
    return true;
  const char *model = NULL;
  const char *m = ag__wire_model_method(path, &model);
  static const char vertex[] = "/publishers/anthropic/models/";
  size_t vl = sizeof vertex - 1;
  return m != NULL && (size_t)(model - path) >= vl &&
         memcmp(model - vl, vertex, vl) == 0 &&
         (ag__wire_path_is(m, "rawPredict") ||
          ag__wire_path_is(m, "streamRawPredict"));
}

/* Anthropic's error shape: {"type": "error", "error": {"type",
 * "message"}}; the code joins the message (its errors have no code). */
static json_t *messages_error_body(unsigned status, const char *type,
                                   const char *code, const char *msg) {
  (void)type;
  const char *at = status == 401   ? "authentication_error"
                   : status == 413 ? "request_too_large"
                   : status < 500  ? "invalid_request_error"
                                   : "api_error";
  char full[1024];
  snprintf(full, sizeof full, "%s [%s]", msg, code);
  return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", at,
                   "message", full);
}

/* ---- for the proxy: the replies it writes, the streams it relays ------- */

/* The client's number for upstream block `idx` (given on first use). */
static int client_index(ag__wire_relay *r, json_int_t idx) {
  if (idx < 0 || idx >= AG__RELAY_BLOCKS)
    return -1;
  if (r->map[idx] < 0)
    r->map[idx] = r->next_index++;
  return r->map[idx];
}

static bool is_held_index(const ag__wire_relay *r, json_int_t idx) {
  return idx >= 0 && idx < AG__RELAY_BLOCKS && r->map[idx] == -2;
}

/* Whether s can be an SSE event's name: no control character (a line
 * break in it would end the "event:" line and start another field). */
static bool name_ok(const char *s) {
  for (; *s != '\0'; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f)
      return false;
  return true;
}

/* Whether a Messages event is held back (a tool_use block, the reply's
 * end) - a block's start marks its index held - or its text checked; 1 on
 * a bad event or a stop (the relay ends), else 0 with *hold set. */
static int relay_classify(ag__wire_relay *r, json_t *j, const char *type,
                          json_int_t idx, size_t pos, bool *hold) {
  *hold = false;
  if (type == NULL)
    return 0; /* forwarded as it came */
  if (strcmp(type, "message_start") == 0) {
    json_t *m = json_object_get(j, "message");
    const char *id = json_string_value(json_object_get(m, "id"));
    const char *model = json_string_value(json_object_get(m, "model"));
    snprintf(r->id, sizeof r->id, "%s", id != NULL ? id : "msg");
    snprintf(r->model, sizeof r->model, "%s",
             model != NULL ? model : "unknown");
  } else if (strcmp(type, "content_block_start") == 0) {
    const char *bt = json_string_value(
        json_object_get(json_object_get(j, "content_block"), "type"));
    if (idx < 0 || idx >= AG__RELAY_BLOCKS) {
      ag__asm_bad(r->a, (long)pos, "a content block index out of range");
      return 1;
    }
    if (bt != NULL && strstr(bt, "tool_use") != NULL) {
      r->map[idx] = -2; /* held until the calls are checked */
      *hold = true;
    }
  } else if (strcmp(type, "content_block_delta") == 0 ||
             strcmp(type, "content_block_stop") == 0) {
    *hold = is_held_index(r, idx);
    size_t tl = 0;
    const char *text = ag__jstr(json_object_get(j, "delta"), "text", &tl);
    if (!*hold && text != NULL && tl > 0 && !ag__wire_relay_text(r, text, tl))
      return 1;
  } else if (strcmp(type, "message_delta") == 0 ||
             strcmp(type, "message_stop") == 0) {
    *hold = true;
  }
  return 0;
}

/* One Messages event through the relay: text blocks go on at once (after
 * the text check), renumbered for the client; tool_use blocks and the
 * reply's end are held until the calls are checked. */
static int messages_relay_event(ag__wire_relay *r, const char *event,
                                const char *data, size_t len, size_t pos) {
  if (ag__anthropic_event(r->a, event, data, len, pos) != 0)
    return 1;
  json_t *j = json_loadb(data, len, 0, NULL);
  if (j == NULL)
    return 1;
  const char *type = json_string_value(json_object_get(j, "type"));
  /* an event without a name line is named by its type, unless the type
   * would break the event's line (a control character in it) */
  const char *name = event[0] != '\0'                ? event
                     : type != NULL && name_ok(type) ? type
                                                     : "message";
  json_t *ix = json_object_get(j, "index");
  json_int_t idx = json_is_integer(ix) ? json_integer_value(ix) : -1;
  bool hold;
  if (relay_classify(r, j, type, idx, pos, &hold) != 0) {
    json_decref(j);
    return 1;
  }
  if (hold) {
    json_t *pair = json_pack("[s, O]", name, j);
    if (pair == NULL || json_array_append_new(r->held_ev, pair) != 0)
      r->held.cut = true;
  } else {
    if (idx >= 0 && type != NULL && strncmp(type, "content_block", 13) == 0)
      json_object_set_new(j, "index", json_integer(client_index(r, idx)));
    ag__sse_named(&r->out, name, json_incref(j));
  }
  json_decref(j);
  return r->out.cut || r->held.cut ? 1 : 0;
}

static void messages_relay_release(ag__wire_relay *r) {
  size_t i;
  json_t *pair;
  json_array_foreach(r->held_ev, i, pair) {
    json_t *o = json_array_get(pair, 1);
    json_t *ix = json_object_get(o, "index");
    /* a held block takes the client's next number; a block the client
     * has seen keeps its own; an index the stream never opened (on a
     * message_delta, or out of range) is left as the upstream sent it */
    json_int_t idx = json_is_integer(ix) ? json_integer_value(ix) : -1;
    if (is_held_index(r, idx))
      r->map[idx] = r->next_index++;
    if (idx >= 0 && idx < AG__RELAY_BLOCKS && r->map[idx] >= 0)
      json_object_set_new(o, "index", json_integer(r->map[idx]));
    ag__sse_named(&r->out, json_string_value(json_array_get(pair, 0)),
                  json_incref(o));
  }
}

/* A text block with `text` at the client's next number. */
static void sse_text_block(ag__wire_relay *r, const char *text) {
  int ci = r->next_index++;
  ag__sse_named(&r->out, "content_block_start",
                json_pack("{s:s, s:i, s:{s:s, s:s}}", "type",
                          "content_block_start", "index", ci, "content_block",
                          "type", "text", "text", ""));
  ag__sse_named(&r->out, "content_block_delta",
                json_pack("{s:s, s:i, s:{s:s, s:s}}", "type",
                          "content_block_delta", "index", ci, "delta", "type",
                          "text_delta", "text", text));
  ag__sse_named(
      &r->out, "content_block_stop",
      json_pack("{s:s, s:i}", "type", "content_block_stop", "index", ci));
}

/* A tool_use block with call tc at the client's next number. */
static void call_block(ag__wire_relay *r, const ag_tool_call *tc) {
  int ci = r->next_index++;
  ag__sse_named(&r->out, "content_block_start",
                json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type",
                          "content_block_start", "index", ci, "content_block",
                          "type", "tool_use", "id", tc->id, "name", tc->name,
                          "input"));
  ag__sse_named(&r->out, "content_block_delta",
                json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type",
                          "content_block_delta", "index", ci, "delta", "type",
                          "input_json_delta", "partial_json", tc->arguments,
                          tc->arguments_len));
  ag__sse_named(
      &r->out, "content_block_stop",
      json_pack("{s:s, s:i}", "type", "content_block_stop", "index", ci));
}

static void message_end(ag__wire_relay *r, const char *stop_reason) {
  ag__sse_named(&r->out, "message_delta",
                json_pack("{s:s, s:{s:s, s:n}, s:{s:i}}", "type",
                          "message_delta", "delta", "stop_reason", stop_reason,
                          "stop_sequence", "usage", "output_tokens", 0));
  ag__sse_named(&r->out, "message_stop",
                json_pack("{s:s}", "type", "message_stop"));
}

static void messages_relay_stop(ag__wire_relay *r, const char *text) {
  sse_text_block(r, text);
  message_end(r, "end_turn");
}

static void messages_relay_tail(ag__wire_relay *r, const ag_reply *rep) {
  if (rep->text != NULL && rep->text[0] != '\0')
    sse_text_block(r, rep->text);
  for (size_t k = 0; k < rep->n_calls; k++)
    call_block(r, &rep->calls[k]);
  message_end(r, rep->n_calls > 0 ? "tool_use" : "end_turn");
}

static void messages_relay_error(ag__wire_relay *r, const char *msg) {
  r->out.cut = false; /* the error ends the stream, after what is queued */
  ag__sse_named(&r->out, "error",
                json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error",
                          "type", "api_error", "message", msg));
}

/* The messages that answer the held-back calls: the assistant's tool_use
 * blocks, then the user's tool_result blocks with the nudges. */
static json_t *messages_nudge_messages(const ag_reply *rep,
                                       const ag_call_check *checks) {
  json_t *uses = json_array(), *results = json_array();
  json_t *out = NULL;
  for (size_t i = 0; uses != NULL && results != NULL && i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    const ag_tool_call *tc = &rep->calls[i];
    json_t *input = json_loadb(tc->arguments, tc->arguments_len, 0, NULL);
    if (!json_is_object(input)) {
      json_decref(input);
      input = json_object();
    }
    if (json_array_append_new(uses, json_pack("{s:s, s:s, s:s, s:o}", "type",
                                              "tool_use", "id", tc->id, "name",
                                              tc->name, "input", input)) != 0 ||
        json_array_append_new(results,
                              json_pack("{s:s, s:s, s:s}", "type",
                                        "tool_result", "tool_use_id", tc->id,
                                        "content", checks[i].message)) != 0)
      goto done;
  }
  if (uses != NULL && results != NULL)
    out = json_pack("[{s:s, s:O}, {s:s, s:O}]", "role", "assistant", "content",
                    uses, "role", "user", "content", results);
done:
  json_decref(uses);
  json_decref(results);
  return out;
}

static bool messages_strip_calls(json_t *reply, char *emsg, size_t cap) {
  json_t *content = json_object_get(reply, "content");
  if (!json_is_array(content)) {
    snprintf(emsg, cap, "no content array");
    return false;
  }
  for (size_t k = json_array_size(content); k-- > 0;) {
    const char *bt =
        json_string_value(json_object_get(json_array_get(content, k), "type"));
    if (bt != NULL && strcmp(bt, "tool_use") == 0)
      json_array_remove(content, k);
  }
  json_object_set_new(reply, "stop_reason", json_string("end_turn"));
  return true;
}

/* One content block of a whole message as a stream's events. */
static void block_events(ag__buf *b, const json_t *blk, int i) {
  const char *bt = json_string_value(json_object_get(blk, "type"));
  json_t *head = json_deep_copy(blk);
  json_t *delta = NULL;
  if (bt != NULL && strcmp(bt, "text") == 0) {
    json_object_set_new(head, "text", json_string(""));
    delta = json_pack("{s:s, s:O}", "type", "text_delta", "text",
                      json_object_get(blk, "text"));
  } else if (bt != NULL && strcmp(bt, "tool_use") == 0) {
    char *in = json_dumps(json_object_get(blk, "input"),
                          JSON_COMPACT | JSON_ENCODE_ANY);
    json_object_set_new(head, "input", json_object());
    delta = json_pack("{s:s, s:s}", "type", "input_json_delta", "partial_json",
                      in != NULL ? in : "{}");
    free(in);
  }
  ag__sse_named(b, "content_block_start",
                json_pack("{s:s, s:i, s:o}", "type", "content_block_start",
                          "index", i, "content_block", head));
  if (delta != NULL)
    ag__sse_named(b, "content_block_delta",
                  json_pack("{s:s, s:i, s:o}", "type", "content_block_delta",
                            "index", i, "delta", delta));
  ag__sse_named(
      b, "content_block_stop",
      json_pack("{s:s, s:i}", "type", "content_block_stop", "index", i));
}

/* A Messages reply as the events of a stream, as Anthropic sends them. */
static bool messages_whole_to_sse(const json_t *msg, ag__buf *out, char *emsg,
                                  size_t cap) {
  const json_t *content = json_object_get(msg, "content");
  if (!json_is_array(content)) {
    snprintf(emsg, cap, "no content array");
    return false;
  }
  json_t *start = json_deep_copy(msg);
  json_object_set_new(start, "content", json_array());
  json_object_set_new(start, "stop_reason", json_null());
  ag__sse_named(
      out, "message_start",
      json_pack("{s:s, s:o}", "type", "message_start", "message", start));
  size_t i;
  const json_t *blk;
  json_array_foreach(content, i, blk) block_events(out, blk, (int)i);
  json_t *out_tokens =
      json_object_get(json_object_get(msg, "usage"), "output_tokens");
  ag__sse_named(out, "message_delta",
                json_pack("{s:s, s:{s:O, s:n}, s:{s:I}}", "type",
                          "message_delta", "delta", "stop_reason",
                          json_object_get(msg, "stop_reason"), "stop_sequence",
                          "usage", "output_tokens",
                          (json_int_t)(json_is_integer(out_tokens)
                                           ? json_integer_value(out_tokens)
                                           : 0)));
  ag__sse_named(out, "message_stop",
                json_pack("{s:s}", "type", "message_stop"));
  return true;
}

static ag__reply_form messages_reply_form(const char *path, const char *query,
                                          const json_t *req) {
  (void)path;
  (void)query;
  return json_is_true(json_object_get(req, "stream")) ? AG__REPLY_SSE
                                                      : AG__REPLY_WHOLE;
}

/* A message with one text block saying `text`, whole or as events. */
static char *messages_stop_body(ag__reply_form form, const char *id,
                                const char *model, const char *text,
                                long long created, size_t *len) {
  (void)created;
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:s, s:n, "
                        "s:{s:i, s:i}}",
                        "id", id, "type", "message", "role", "assistant",
                        "model", model, "content", "type", "text", "text", text,
                        "stop_reason", "end_turn", "stop_sequence", "usage",
                        "input_tokens", 0, "output_tokens", 0);
  char *t = NULL;
  if (o != NULL && form == AG__REPLY_SSE) {
    ag__buf b;
    char emsg[64];
    ag__buf_init(&b, AG__HTTP_BODY_MAX);
    if (messages_whole_to_sse(o, &b, emsg, sizeof emsg) && !b.cut) {
      t = b.p;
      *len = b.len;
    } else {
      ag__buf_free(&b);
    }
  } else if (o != NULL) {
    t = json_dumps(o, JSON_COMPACT);
    if (t != NULL)
      *len = strlen(t);
  }
  json_decref(o);
  return t;
}

/* ---- the turn read from the tape (for the proxy) ----------------------- */

/* Whether messages_to_chat passes message token m (its 400s are the tree
 * reading's to give). */
static bool tape_message_ok(const ag__wtape *t, size_t m) {
  size_t role = ag__wt_get(t, m, "role"), content = ag__wt_get(t, m, "content");
  if (!ag__wt_eq(t, role, "user") && !ag__wt_eq(t, role, "assistant"))
    return false;
  if (!ag__wt_is(t, content, AG__JT_STR) && !ag__wt_is(t, content, AG__JT_ARR))
    return false;
  AG__WT_EACH(t, content, b) {
    size_t bt = ag__wt_get(t, b, "type");
    if (!ag__wt_is(t, bt, AG__JT_STR))
      return false;
    if (ag__wt_eq(t, bt, "tool_use") &&
        (!ag__wt_is(t, ag__wt_get(t, b, "id"), AG__JT_STR) ||
         !ag__wt_is(t, ag__wt_get(t, b, "name"), AG__JT_STR)))
      return false;
    if (ag__wt_eq(t, bt, "tool_result") &&
        !ag__wt_is(t, ag__wt_get(t, b, "tool_use_id"), AG__JT_STR))
      return false;
  }
  return true;
}

/* Whether message token m has text: a string, or a text block. */
static bool tape_has_text(const ag__wtape *t, size_t m) {
  size_t content = ag__wt_get(t, m, "content");
  if (ag__wt_is(t, content, AG__JT_STR))
    return true;
  AG__WT_EACH(t, content, b) {
    if (ag__wt_eq(t, ag__wt_get(t, b, "type"), "text"))
      return true;
  }
  return false;
}

/* An assistant message of the turn to the sink: its text, its tool_use
 * blocks as calls. The arguments are the input's own text: the guard
 * reads arguments only through their JCS form (the call signature), the
 * same as the tree's compact dump of it (duplicate keys and numbers
 * jansson reads differently never reach here). */
static bool tape_reply(ag__wtape *t, size_t content, const ag__turn_sink *k) {
  size_t len;
  const char *text = ag__wt_blocks_text(t, content, &len);
  if (text == NULL || !k->step(k->user, text, len))
    return false;
  AG__WT_EACH(t, content, b) {
    size_t bt = ag__wt_get(t, b, "type");
    if (ag__wt_eq(t, bt, "tool_result"))
      return false;
    if (!ag__wt_eq(t, bt, "tool_use"))
      continue;
    const char *id = ag__wt_str(t, ag__wt_get(t, b, "id"), NULL);
    const char *name = ag__wt_str(t, ag__wt_get(t, b, "name"), NULL);
    size_t input = ag__wt_get(t, b, "input"), at = 0, al = 2;
    const char *args = "{}";
    if (input != 0) {
      al = ag__jcs_member_span(t->j, input - 1, &at);
      args = t->s + at;
    }
    if (id == NULL || name == NULL || !k->call(k->user, id, name, args, al))
      return false;
  }
  return true;
}

/* A user message's tool_result blocks to the sink. */
static bool tape_results(ag__wtape *t, size_t content, const ag__turn_sink *k) {
  AG__WT_EACH(t, content, b) {
    if (!ag__wt_eq(t, ag__wt_get(t, b, "type"), "tool_result"))
      continue;
    size_t len;
    const char *id = ag__wt_str(t, ag__wt_get(t, b, "tool_use_id"), NULL);
    const char *text = ag__wt_blocks_text(t, ag__wt_get(t, b, "content"), &len);
    if (id == NULL || text == NULL ||
        !k->result(k->user, id, text, len,
                   ag__wt_is(t, ag__wt_get(t, b, "is_error"), AG__JT_TRUE)))
      return false;
  }
  return true;
}

/* The turn from the last user message with text on: what messages_to_chat
 * and the chat replay would read, without building the chat messages. */
static int messages_tape_turn(ag__wtape *t, size_t conv,
                              const ag__turn_sink *k) {
  size_t from = 0, n_steps = 0, n_calls = 0;
  if (ag__wt_count(t, conv) == 0)
    return 0;
  AG__WT_EACH(t, conv, e) {
    if (!tape_message_ok(t, e))
      return 0;
    bool user = ag__wt_eq(t, ag__wt_get(t, e, "role"), "user");
    if (user && tape_has_text(t, e)) {
      from = e;
      n_steps = n_calls = 0;
    } else if (!user) {
      n_steps++;
      AG__WT_EACH(t, ag__wt_get(t, e, "content"), b) {
        n_calls += ag__wt_eq(t, ag__wt_get(t, b, "type"), "tool_use");
      }
    }
  }
  if (from == 0)
    return 0; /* no user text: the tree converts every message */
  if (k->begin(k->user, n_steps, n_calls) < 0)
    return -1;
  size_t end = ag__jcs_tok_next(t->j, conv);
  for (size_t m = ag__jcs_tok_next(t->j, from); m < end;
       m = ag__jcs_tok_next(t->j, m)) {
    size_t content = ag__wt_get(t, m, "content");
    bool ok = ag__wt_eq(t, ag__wt_get(t, m, "role"), "assistant")
                  ? tape_reply(t, content, k)
                  : tape_results(t, content, k);
    if (!ok)
      return 0;
  }
  return 1;
}

const ag__wire ag__wire_messages = {
    .name = "anthropic",
    .api = "Messages",
    .path = "/v1/messages",
    .base_url = "https://api.anthropic.com",
    .suffix = "/v1/messages",
    .key_env = "ANTHROPIC_API_KEY",
    .key_header = "x-api-key: ",
    .extra_header = "anthropic-version: 2023-06-01",
    .end_marker = "message_stop",
    .request = ag__anthropic_request,
    .response = ag__anthropic_response,
    .event = ag__anthropic_event,
    .to_chat = messages_to_chat,
    .turn_start = messages_turn_start,
    .looks_like = messages_looks_like,
    .conv_key = "messages",
    .serves = messages_serves,
    .error_body = messages_error_body,
    .reply_form = messages_reply_form,
    .stop_body = messages_stop_body,
    .id_prefix = "msg_agentguard_",
    .conv_expect = "an array",
    .otel_provider = "anthropic",
    .otel_operation = "chat",
    .route_prefix = "/v1/messages",
    .tape_turn = messages_tape_turn,
    .relay_event = messages_relay_event,
    .relay_release = messages_relay_release,
    .relay_stop = messages_relay_stop,
    .relay_tail = messages_relay_tail,
    .relay_error = messages_relay_error,
    .end_missing = "no message_stop",
    .nudge_messages = messages_nudge_messages,
    .strip_calls = messages_strip_calls,
    .whole_to_sse = messages_whole_to_sse,
};
