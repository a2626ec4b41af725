/*
 * src/providers/provider.c - the provider handle and model replies.
 *
 * What it is for. Every model client (the scripted provider, the only one
 * built in today, or a user's own) is a vtable plus its state, wrapped in one
 * opaque ag_provider. The loop only ever calls ag_provider_complete(), so the
 * guarantees the loop relies on are made here once rather than trusted to
 * every implementation:
 *   - *out and *perr are zeroed before the vtable runs, and perr starts with
 *     retry_after_ms = -1, so a provider fills in only what it knows;
 *   - complete() is not called at all when the token has already fired;
 *   - on any failure *out comes back empty (a half-built reply is freed), so
 *     callers release a reply only after AG_OK;
 *   - an AG_EPROVIDER always carries a service name (the provider's kind when
 *     the provider gave none), a message, NUL-terminated buffers and a
 *     retry_after_ms that is -1 or >= 0;
 *   - a failure that happens while the token is cancelled is reported as
 *     AG_ECANCELLED, so the loop never retries a request the turn gave up on
 *     (an HTTP client aborted by its progress callback sees "connection
 *     failed", which would otherwise look transient).
 *
 * Data structures. ag_provider is the vtable pointer (borrowed, static
 * storage) and `self` (owned: destroyed by ag_provider_free). A reply's call
 * array grows by exactly one element per ag_reply_add_call: replies carry a
 * handful of calls, and ag_reply has no capacity field to amortise with.
 *
 * Threading. A provider is used by one thread at a time; nothing here has
 * state of its own beyond the handle.
 *
 * Messages as text. The loop sends its history as JSON text
 * (ag_request.messages_json); a provider whose vtable does not set
 * AG_PROVIDER_MESSAGES_TEXT gets a tree parsed from it for the call and
 * freed after it, so custom providers written for the tree keep working.
 *
 * Rejected: validating req->messages here (a scripted provider ignores
 * them, and the loop builds them); retrying here (retries are the loop's,
 * with DESIGN.md's network rules, so that every retry is an event).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard/providers.h"

#include "../core/internal.h"

struct ag_provider {
  const ag_provider_vtable *vt; /* borrowed: static storage */
  void *self;                   /* owned: vt->destroy */
};

/* ------------------------------------------------------------------------ */
/* Replies                                                                  */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_reply_clear(ag_reply *r) {
  if (r == NULL)
    return;
  free(r->text);
  for (size_t i = 0; i < r->n_calls; i++) {
    free(r->calls[i].id);
    free(r->calls[i].name);
    free(r->calls[i].arguments);
  }
  free(r->calls);
  free(r->refusal);
  memset(r, 0, sizeof(*r));
}

AG_EXTERN ag_err_t ag_reply_add_call(ag_reply *r, const char *id,
                                     const char *name, const char *arguments,
                                     size_t arguments_len) {
  if (r == NULL || name == NULL || (arguments == NULL && arguments_len > 0))
    return AG_EINVAL;
  if (r->n_calls >= SIZE_MAX / sizeof(ag_tool_call) - 1)
    return AG_ENOMEM;
  ag_tool_call c = {0};
  if (id != NULL && id[0] != '\0') {
    c.id = ag__strndup(id, strlen(id));
  } else {
    char gen[32];
    int n = snprintf(gen, sizeof(gen), "call_%zu", r->n_calls + 1);
    c.id = ag__strndup(gen, (size_t)n);
  }
  c.name = ag__strndup(name, strlen(name));
  c.arguments = ag__strndup(arguments == NULL ? "" : arguments, arguments_len);
  c.arguments_len = arguments_len;
  ag_tool_call *grown = NULL;
  if (c.id != NULL && c.name != NULL && c.arguments != NULL)
    grown = realloc(r->calls, (r->n_calls + 1) * sizeof(*grown));
  if (grown == NULL) {
    /* The reply is left exactly as it was. */
    free(c.id);
    free(c.name);
    free(c.arguments);
    return AG_ENOMEM;
  }
  grown[r->n_calls] = c;
  r->calls = grown;
  r->n_calls++;
  return AG_OK;
}

/* ------------------------------------------------------------------------ */
/* The handle                                                               */
/* ------------------------------------------------------------------------ */

AG_EXTERN ag_err_t ag_provider_new(ag_provider **out,
                                   const ag_provider_vtable *vt, void *self,
                                   ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  /* `self` is stolen even on failure (jansson's "steal"): whenever there is
   * a destroy function to call, a failed constructor calls it. */
  if (out == NULL || vt == NULL || vt->complete == NULL) {
    if (vt != NULL && vt->destroy != NULL)
      vt->destroy(self);
    return ag__set_error(err, AG_EINVAL, -1, "%s",
                         out == NULL  ? "ag_provider_new: out is NULL"
                         : vt == NULL ? "ag_provider_new: vtable is NULL"
                                      : "ag_provider_new: vtable has no "
                                        "complete function");
  }
  /* The first layout ends with `destroy`; anything larger than this
   * library's layout has fields it cannot honour. */
  size_t first = offsetof(ag_provider_vtable, destroy) + sizeof(vt->destroy);
  if (vt->size < first || vt->size > sizeof(ag_provider_vtable)) {
    size_t got = vt->size;
    if (vt->destroy != NULL)
      vt->destroy(self);
    return ag__set_error(
        err, AG_EINVAL, -1,
        "ag_provider_new: vtable size %zu is not an ag_provider_vtable this "
        "library knows (%zu..%zu; set size = sizeof(ag_provider_vtable)%s)",
        got, first, sizeof(ag_provider_vtable),
        got > sizeof(ag_provider_vtable)
            ? ": the provider was built against a newer agentguard"
            : "");
  }
  ag_provider *p = malloc(sizeof(*p));
  if (p == NULL) {
    if (vt->destroy != NULL)
      vt->destroy(self);
    return ag__set_error(err, AG_ENOMEM, -1,
                         "out of memory creating a provider");
  }
  p->vt = vt;
  p->self = self;
  *out = p;
  return AG_OK;
}

AG_EXTERN void ag_provider_free(ag_provider *p) {
  if (p == NULL)
    return;
  if (p->vt->destroy != NULL)
    p->vt->destroy(p->self);
  free(p);
}

AG_EXTERN const char *ag_provider_kind(const ag_provider *p) {
  if (p == NULL || p->vt->kind == NULL || p->vt->kind[0] == '\0')
    return "custom";
  return p->vt->kind;
}

/* A provider that forgot to terminate a buffer must not make us read past
 * it. */
static void terminate(char *buf, size_t cap) {
  buf[cap - 1] = '\0';
}

extern char **environ;

/* Rewrites buf (a NUL-terminated string in cap bytes) with its credentials
 * redacted (src/core/redact.c); a result longer than cap is cut. */
static void redact_field(char *buf, size_t cap, const ag__secret *sec,
                         size_t n) {
  size_t len = strlen(buf);
  if (!ag__redact_needed(buf, len, sec, n))
    return;
  char tmp[sizeof(((ag_provider_error *)0)->details)];
  if (len >= sizeof(tmp))
    len = sizeof(tmp) - 1;
  memcpy(tmp, buf, len);
  ag__redact(tmp, len, sec, n, buf, cap);
}

/* Whether the vtable has the flags field and says it reads messages_json. */
static bool reads_text(const ag_provider_vtable *vt) {
  return vt->size >= offsetof(ag_provider_vtable, flags) + sizeof(vt->flags) &&
         (vt->flags & AG_PROVIDER_MESSAGES_TEXT) != 0;
}

static void sanitize_perr(const ag_provider *p, ag_provider_error *perr) {
  terminate(perr->service, sizeof(perr->service));
  terminate(perr->message, sizeof(perr->message));
  terminate(perr->details, sizeof(perr->details));
  /* A provider's error may quote the request's Authorization header or
   * the key itself: never pass one on (docs/security.md#secrets). */
  ag__secret sec[AG__SECRETS_MAX];
  size_t n = ag__secrets_from_env(environ, sec, AG__SECRETS_MAX);
  redact_field(perr->service, sizeof(perr->service), sec, n);
  redact_field(perr->message, sizeof(perr->message), sec, n);
  redact_field(perr->details, sizeof(perr->details), sec, n);
  if (perr->retry_after_ms < -1)
    perr->retry_after_ms = -1;
  if (perr->service[0] == '\0')
    ag__scopy(perr->service, sizeof(perr->service), ag_provider_kind(p));
  if (perr->message[0] == '\0') {
    if (perr->exhausted)
      ag__scopy(perr->message, sizeof(perr->message),
                "the model script has no more replies");
    else if (perr->http_status > 0) {
      snprintf(perr->message, sizeof(perr->message), "HTTP status %d",
               perr->http_status);
      perr->message_is_default = true;
    } else
      ag__scopy(perr->message, sizeof(perr->message),
                ag_strerror(AG_EPROVIDER));
  }
}

AG_EXTERN ag_err_t ag_provider_complete(ag_provider *p, const ag_request *req,
                                        ag_cancel *cancel, ag_delta_fn on_delta,
                                        void *delta_user, ag_reply *out,
                                        ag_provider_error *perr) {
  ag_provider_error scratch;
  if (perr == NULL)
    perr = &scratch;
  memset(perr, 0, sizeof(*perr));
  perr->retry_after_ms = -1;
  if (out != NULL)
    memset(out, 0, sizeof(*out));
  if (p == NULL || req == NULL || out == NULL)
    return AG_EINVAL;
  if (ag_cancel_check(cancel, ag_now_ms()) != AG_CANCEL_NONE)
    return AG_ECANCELLED;

  /* Messages only as text, for a provider that reads the tree: a tree for
   * this call (providers.h, AG_PROVIDER_MESSAGES_TEXT). */
  ag_request with_tree;
  json_t *tree = NULL;
  if (req->messages == NULL && req->messages_json != NULL &&
      !reads_text(p->vt)) {
    json_error_t jerr;
    tree = json_loadb(req->messages_json, req->messages_json_len,
                      JSON_ALLOW_NUL, &jerr);
    if (tree == NULL)
      return json_error_code(&jerr) == json_error_out_of_memory ? AG_ENOMEM
                                                                : AG_EINVAL;
    with_tree = *req;
    with_tree.messages = tree;
    req = &with_tree;
  }
  ag_err_t rc =
      p->vt->complete(p->self, req, cancel, on_delta, delta_user, out, perr);
  json_decref(tree);
  if (rc == AG_OK)
    return AG_OK;
  ag_reply_clear(out);
  if (rc == AG_EPROVIDER &&
      ag_cancel_check(cancel, ag_now_ms()) != AG_CANCEL_NONE) {
    rc = AG_ECANCELLED;
  }
  if (rc == AG_EPROVIDER) {
    sanitize_perr(p, perr);
  } else {
    /* Only AG_EPROVIDER fills perr; anything else leaves it as it began. */
    memset(perr, 0, sizeof(*perr));
    perr->retry_after_ms = -1;
  }
  return rc;
}
