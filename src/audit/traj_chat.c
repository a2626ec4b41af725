/*
 * src/audit/traj_chat.c - the reader of OpenAI chat transcripts: an array of
 * messages, {"messages": [...]}, or one message per line; another API
 * shape arrives here converted to chat by the wire layer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder.h"

/* ------------------------------------------------------------------------ */
/* OpenAI chat transcripts                                                  */
/* ------------------------------------------------------------------------ */

/* The first unanswered call of the current step, its id equal to `id` (any
 * id when NULL, a legacy function reply matches by name instead). Returns
 * the index in b->calls, or SIZE_MAX. */
static size_t find_call(builder *b, const char *id, const char *by_name,
                        bool *already) {
  bstep *s = ag__tb_cur_step(b);
  *already = false;
  if (s == NULL || s->rejected)
    return SIZE_MAX;
  for (size_t k = 0; k < s->n_calls; k++) {
    size_t ci = s->call0 + k, ri = s->res0 + k;
    if (id != NULL) {
      if (b->ids[ci] == NULL || strcmp(b->ids[ci], id) != 0)
        continue;
      if (b->answered[ri]) {
        *already = true;
        continue;
      }
      return ci;
    }
    if (b->answered[ri])
      continue;
    if (by_name != NULL && strcmp(b->calls[ci].name, by_name) != 0)
      continue;
    return ci;
  }
  return SIZE_MAX;
}

/* Every call of the current step must have its reply before `what`. */
static ag_err_t check_answered(builder *b, const char *what) {
  bstep *s = ag__tb_cur_step(b);
  if (s == NULL)
    return AG_OK;
  for (size_t k = 0; k < s->n_calls; k++) {
    if (b->answered[s->res0 + k])
      continue;
    const char *id = b->ids[s->call0 + k];
    /* Named where the call was made, not where the reply was missed. */
    b->unit_no = s->origin;
    b->line = s->origin_line;
    return ag__tb_fail(
        b, AG_EINVAL, "tool call %s%s%s(%s) has no tool reply %s",
        id != NULL ? "'" : "", id != NULL ? id : "", id != NULL ? "' " : "",
        b->calls[s->call0 + k].name, what);
  }
  return AG_OK;
}

static ag_err_t chat_assistant(builder *b, const json_t *m) {
  ag_err_t rc;
  if ((rc = check_answered(b, "before the next assistant message")) != AG_OK)
    return rc;
  const json_t *tcs = json_object_get(m, "tool_calls");
  const json_t *fc = json_object_get(m, "function_call");
  if (tcs != NULL && !json_is_null(tcs) && !json_is_array(tcs))
    return ag__tb_fail(b, AG_EINVAL, "\"tool_calls\" must be an array, got %s",
                       ag__json_kind(tcs));
  if ((rc = ag__tb_step(b, 0)) != AG_OK)
    return rc;
  if ((rc = ag__tb_usage(b, m, &ag__tb_cur_step(b)->tokens)) != AG_OK)
    return rc;
  const json_t *content = json_object_get(m, "content");
  if (json_is_string(content) || json_is_null(content)) {
    bstep *st = ag__tb_cur_step(b);
    if ((rc = ag__tb_text(b, content, "content", &st->text, &st->text_len)) !=
        AG_OK)
      return rc;
    st->has_text = true;
  }
  for (size_t k = 0; k < json_array_size(tcs); k++) {
    const json_t *tc = json_array_get(tcs, k);
    if (!json_is_object(tc))
      return ag__tb_fail(b, AG_EINVAL,
                         "tool call %zu must be an object, got %s", k + 1,
                         ag__json_kind(tc));
    const json_t *fn = json_object_get(tc, "function");
    const json_t *src = json_is_object(fn) ? fn : tc;
    const json_t *name = json_object_get(src, "name");
    if (!json_is_string(name))
      return ag__tb_fail(b, AG_EINVAL, "tool call %zu has no function name",
                         k + 1);
    const json_t *id = json_object_get(tc, "id");
    if (id != NULL && !json_is_string(id) && !json_is_null(id))
      return ag__tb_fail(b, AG_EINVAL, "tool call %zu: \"id\" must be a string",
                         k + 1);
    const char *a;
    size_t al;
    if ((rc = ag__tb_args(b, json_object_get(src, "arguments"), &a, &al)) !=
        AG_OK)
      return rc;
    if ((rc = ag__tb_call(b, json_string_value(name), a, al,
                          json_string_value(id), true)) != AG_OK)
      return rc;
  }
  if (json_array_size(tcs) == 0 && json_is_object(fc)) {
    const json_t *name = json_object_get(fc, "name");
    if (!json_is_string(name))
      return ag__tb_fail(b, AG_EINVAL, "\"function_call\" has no name");
    const char *a;
    size_t al;
    if ((rc = ag__tb_args(b, json_object_get(fc, "arguments"), &a, &al)) !=
        AG_OK)
      return rc;
    if ((rc = ag__tb_call(b, json_string_value(name), a, al, NULL, true)) !=
        AG_OK)
      return rc;
  }
  return AG_OK;
}

static ag_err_t chat_tool(builder *b, const json_t *m, bool legacy) {
  ag_err_t rc;
  const json_t *idv = json_object_get(m, "tool_call_id");
  if (idv != NULL && !json_is_string(idv) && !json_is_null(idv))
    return ag__tb_fail(b, AG_EINVAL,
                       "\"tool_call_id\" must be a string, got %s",
                       ag__json_kind(idv));
  const char *id = json_string_value(idv);
  const char *name =
      legacy ? json_string_value(json_object_get(m, "name")) : NULL;
  bool already;
  size_t ci = find_call(b, id, name, &already);
  if (ci == SIZE_MAX) {
    if (already)
      return ag__tb_fail(b, AG_EINVAL, "a second tool reply for call '%s'", id);
    if (id != NULL)
      return ag__tb_fail(
          b, AG_EINVAL,
          "tool reply for call '%s' without its call (no assistant "
          "tool call with that id is waiting for a reply)",
          id);
    return ag__tb_fail(b, AG_EINVAL,
                       "tool reply without its call (no assistant tool call is "
                       "waiting for a reply)");
  }
  bstep *s = ag__tb_cur_step(b);
  size_t ri = s->res0 + (ci - s->call0);
  ag_traj_result *r = &b->results[ri];
  if ((rc = ag__tb_text(b, json_object_get(m, "content"), "content", &r->text,
                        &r->text_len)) != AG_OK)
    return rc;
  const json_t *ie = json_object_get(m, "is_error");
  if (ie != NULL && !json_is_boolean(ie) && !json_is_null(ie))
    return ag__tb_fail(b, AG_EINVAL, "\"is_error\" must be true or false");
  /* Without an explicit is_error the guard's error prefixes decide. */
  r->outcome = json_is_true(ie) ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
  b->answered[ri] = true;
  return AG_OK;
}

static ag_err_t chat_message(builder *b, const json_t *m) {
  ag_err_t rc;
  if (!json_is_object(m))
    return ag__tb_fail(b, AG_EINVAL, "a chat message must be an object, got %s",
                       ag__json_kind(m));
  const json_t *rv = json_object_get(m, "role");
  if (!json_is_string(rv))
    return ag__tb_fail(b, AG_EINVAL, "not a chat message (no \"role\")");
  const char *role = json_string_value(rv);
  if (strcmp(role, "assistant") == 0)
    return chat_assistant(b, m);
  if (strcmp(role, "tool") == 0)
    return chat_tool(b, m, false);
  if (strcmp(role, "function") == 0)
    return chat_tool(b, m, true);
  if (strcmp(role, "user") == 0) {
    if ((rc = check_answered(b, "before the next user message")) != AG_OK)
      return rc;
    ag__tb_user(b, -1);
    return AG_OK;
  }
  if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)
    return AG_OK;
  return ag__tb_fail(b, AG_EINVAL,
                     "unknown role '%.40s' (expected system, developer, user, "
                     "assistant, tool or function)",
                     role);
}

/* `lines` (may be NULL) gives each message's line in a JSON Lines input. */
ag_err_t ag__tb_parse_chat(builder *b, const json_t *msgs, const long *lines) {
  ag_err_t rc;
  b->unit = "message";
  for (size_t i = 0; i < json_array_size(msgs); i++) {
    b->unit_no = i + 1;
    b->line = lines != NULL ? lines[i] : 0;
    if ((rc = chat_message(b, json_array_get(msgs, i))) != AG_OK)
      return rc;
  }
  return check_answered(b, "(the transcript ends)");
}
