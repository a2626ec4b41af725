/*
 * src/proxy/stored.c - the conversation a request continues on the
 * upstream, read back from it (internal.h: ag__px_stored_request).
 *
 * A Responses request with `previous_response_id` or `conversation` holds
 * only its newest items - the function_call_output of the last call, say -
 * and the upstream adds what it stored before them. Replayed alone, such a
 * turn shows the guard nothing to stop. So the proxy asks the upstream for
 * what it stored, where the wire says it is (ag__wire.stored), with the
 * client's own headers and on the request's worker thread:
 *   - previous_response_id R: the items that went into R (for a response
 *     in a chain, OpenAI's list holds the chain's earlier items too), read
 *     newest first a page at a time, then R itself, whose output (the
 *     calls the current request answers) follows them;
 *   - conversation C: its items, newest first, a page at a time.
 * Pages stop at the turn's start (a user message) or the list's end, so a
 * long conversation costs the pages of its last turn only. A server that
 * lists only a response's own inputs (no user message in them, none left
 * to read) has the chain walked back through each response's
 * previous_response_id, an item read twice (by its id) taken once.
 * Bounds: FETCH_PAGES_MAX pages a list, FETCH_CHAIN_MAX responses walked
 * (each once), FETCH_GETS_MAX reads in all (a client's request never makes
 * more upstream requests than that besides itself), and --max-body bytes
 * of bodies read in all. Past a bound - or when a later page or an earlier
 * response cannot be read - the turn is decided from the newest items
 * read (the ones a loop is made of), outputs whose calls were not read
 * left out; only when the first page or the response the request answers
 * cannot be read is the request relayed unguarded.
 *
 * The items, then the request's own, make a request decided as one that
 * carries its whole conversation; the request itself goes upstream as the
 * client sent it. When anything fails - a status other than 2xx (a
 * response stored with `store: false` is a 404), a body not of the list's
 * shape, the upstream unreachable - the request is relayed unguarded, as
 * before this existed, and the `unguarded` event says why.
 *
 * Rejected: remembering replies in the proxy to answer previous_response_id
 * from memory. Replicas behind a load balancer would each know part of a
 * conversation, and memory would grow with conversations; the upstream has
 * the whole of it, and two GETs (one when the turn starts a new page)
 * cost little beside a model's reply.
 */
#include "internal.h"

#define FETCH_PAGES_MAX 10
#define FETCH_CHAIN_MAX 8
#define FETCH_GETS_MAX 16
#define FETCH_PAGE_ITEMS 100

typedef struct fetch {
  ag_proxy *p;
  req_ctx *q;
  char base[1024];   /* the client's path without its last segment */
  const char *query; /* the client's query ("" when none): Azure's version */
  size_t left;       /* bytes of bodies still allowed */
  int gets_left;     /* requests still allowed */
  bool cut;          /* a bound stopped the reading: older items unread */
  char walked[FETCH_CHAIN_MAX][256]; /* the responses read, by id */
  int n_walked;
  char *why;
  size_t why_cap;
} fetch;

/* GET base+rest?query&extra as a JSON object (*out, the caller's), or
 * false with f->why set. */
static bool get_object(fetch *f, const char *rest, const char *extra,
                       json_t **out) {
  char uri[2048];
  const char *sep = f->query[0] != '\0' && extra[0] != '\0' ? "&" : "";
  int n = snprintf(uri, sizeof uri, "%s%s%s%s%s%s", f->base, rest,
                   f->query[0] != '\0' || extra[0] != '\0' ? "?" : "", f->query,
                   sep, extra);
  *out = NULL;
  if (n < 0 || (size_t)n >= sizeof uri) {
    snprintf(f->why, f->why_cap, "the path %s%s is too long", f->base, rest);
    return false;
  }
  upstream u;
  f->gets_left--;
  ag__px_send_upstream(f->q->sh->relay, f->p, f->q->client_hdrs, "GET", uri,
                       NULL, 0, false, f->q->client_fd, &u);
  if (u.cc != CURLE_OK || u.no_budget || u.too_big)
    snprintf(f->why, f->why_cap, "GET %s%s: %s", f->base, rest,
             u.too_big     ? "the reply is too large"
             : u.no_budget ? "the proxy's memory for replies is full"
                           : curl_easy_strerror(u.cc));
  else if (u.status < 200 || u.status >= 300)
    snprintf(f->why, f->why_cap, "GET %s%s: HTTP %ld", f->base, rest, u.status);
  else if (u.len > f->left)
    snprintf(f->why, f->why_cap,
             "GET %s%s: the stored conversation read so far is larger than "
             "--max-body",
             f->base, rest);
  else if (u.body == NULL ||
           (*out = json_loadb(u.body, u.len, 0, NULL)) == NULL ||
           !json_is_object(*out))
    snprintf(f->why, f->why_cap, "GET %s%s: the reply is not a JSON object",
             f->base, rest);
  else
    f->left -= u.len;
  ag__px_upstream_free(&u);
  if (f->why[0] != '\0') {
    json_decref(*out);
    *out = NULL;
    return false;
  }
  return true;
}

/* The reading stops here with what it has (f->why forgotten): true. */
static bool cut_here(fetch *f) {
  f->cut = true;
  f->why[0] = '\0';
  return true;
}

/* Whether an item is a user's message: where a turn starts. */
static bool user_message(const json_t *item) {
  const char *type = ag__jstr(item, "type", NULL);
  const char *role = ag__jstr(item, "role", NULL);
  return (type == NULL || strcmp(type, "message") == 0) && role != NULL &&
         strcmp(role, "user") == 0;
}

/* The list at `rest`, newest first, appended to `newest`: page by page
 * until a user message (*turn set), the list's end or a bound (f->cut
 * set: older items left unread); `keep` requests are left for what
 * follows. */
static bool read_list(fetch *f, const char *rest, json_t *newest, bool *turn,
                      int keep) {
  char after[256] = "";
  *turn = false;
  for (int page = 0; page < FETCH_PAGES_MAX; page++) {
    if (f->gets_left <= keep) {
      f->cut = true;
      return true;
    }
    char extra[320];
    snprintf(extra, sizeof extra, "order=desc&limit=%d%s%s", FETCH_PAGE_ITEMS,
             after[0] != '\0' ? "&after=" : "", after);
    json_t *j;
    if (!get_object(f, rest, extra, &j)) /* a later page: what was read */
      return page > 0 ? cut_here(f) : false;
    const json_t *data = json_object_get(j, "data");
    if (!json_is_array(data)) {
      snprintf(f->why, f->why_cap, "GET %s%s: no \"data\" array", f->base,
               rest);
      json_decref(j);
      return false;
    }
    size_t i;
    const json_t *item;
    json_array_foreach(data, i, item) {
      if (!json_is_object(item) ||
          json_array_append(newest, (json_t *)item) != 0) {
        snprintf(f->why, f->why_cap, "GET %s%s: data[%zu] is not an item",
                 f->base, rest, i);
        json_decref(j);
        return false;
      }
      if (user_message(item)) {
        *turn = true;
        break;
      }
    }
    const char *last = ag__jstr(j, "last_id", NULL);
    bool more = json_is_true(json_object_get(j, "has_more")) && last != NULL &&
                strlen(last) < sizeof after &&
                strspn(last, "abcdefghijklmnopqrstuvwxyz"
                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "0123456789_-") == strlen(last);
    bool has_more = json_is_true(json_object_get(j, "has_more"));
    if (more)
      snprintf(after, sizeof after, "%s", last);
    json_decref(j);
    if (!*turn && has_more && !more) /* no usable cursor: older unread */
      return cut_here(f);
    if (*turn || !more)
      return true;
  }
  f->cut = true;
  return true;
}

/* Appends `item` to `to` unless its id was taken already (`seen`). */
static bool take(json_t *to, json_t *seen, json_t *item) {
  const char *id = ag__jstr(item, "id", NULL);
  if (id != NULL && id[0] != '\0') {
    if (json_object_get(seen, id) != NULL)
      return true;
    if (json_object_set_new(seen, id, json_true()) != 0)
      return false;
  }
  return json_array_append(to, item) == 0;
}

/* The stored items, oldest first, into *all; false with f->why. */
static bool read_stored(fetch *f, const ag__wire *w, const json_t *req,
                        json_t *all, json_t *seen) {
  char list[320], object[320];
  if (!w->stored(req, NULL, list, object, sizeof list)) {
    snprintf(f->why, f->why_cap, "the id it continues cannot be read back");
    return false;
  }
  for (int step = 0; step < FETCH_CHAIN_MAX; step++) {
    json_t *newest = json_array(), *seg = json_array(), *obj = NULL;
    bool turn = false, ok = newest != NULL && seg != NULL;
    if (!ok)
      snprintf(f->why, f->why_cap, "out of memory");
    /* one request is kept for the response itself: its output holds the
     * calls the request answers */
    ok = ok && read_list(f, list, newest, &turn, object[0] != '\0');
    ok = ok && (object[0] == '\0' || get_object(f, object, "", &obj));
    const json_t *output = json_object_get(obj, "output");
    if (ok && obj != NULL && !json_is_array(output)) {
      snprintf(f->why, f->why_cap, "GET %s%s: no \"output\" array", f->base,
               object);
      ok = false;
    }
    if (!ok && step > 0) { /* an earlier response: keep the later ones */
      json_decref(newest);
      json_decref(seg);
      json_decref(obj);
      return cut_here(f);
    }
    /* the newest segment's items are taken first, so that an item an
     * older response lists again is dropped from the older one */
    for (size_t i = json_array_size(output); ok && i > 0; i--)
      ok = take(seg, seen, json_array_get(output, i - 1));
    for (size_t i = 0; ok && i < json_array_size(newest); i++)
      ok = take(seg, seen, json_array_get(newest, i));
    /* seg is newest first: `all` (newest first too) gets it after the
     * segments of later responses */
    ok = ok && json_array_extend(all, seg) == 0;
    if (!ok && f->why[0] == '\0')
      snprintf(f->why, f->why_cap, "out of memory");
    /* the paths of the response before it, while obj holds its id; a
     * chain that comes back to a response read already ends there */
    const char *prev = ag__jstr(obj, "previous_response_id", NULL);
    bool next = ok && !turn && !f->cut && f->gets_left > 0 && prev != NULL &&
                strlen(prev) < sizeof f->walked[0] &&
                f->n_walked < FETCH_CHAIN_MAX;
    for (int k = 0; next && k < f->n_walked; k++)
      next = strcmp(f->walked[k], prev) != 0;
    if (next) {
      snprintf(f->walked[f->n_walked++], sizeof f->walked[0], "%s", prev);
      next = w->stored(req, prev, list, object, sizeof list);
    }
    json_decref(newest);
    json_decref(seg);
    json_decref(obj);
    if (!ok)
      return false;
    if (!next)
      return true;
  }
  return true;
}

/* Whether an item is a call's output ("function_call_output",
 * "custom_tool_call_output", ...): at the start of what was read, its call
 * was not. */
static bool orphan_output(const json_t *item) {
  const char *type = ag__jstr(item, "type", NULL);
  size_t n = type != NULL ? strlen(type) : 0;
  return n > 7 && strcmp(type + n - 7, "_output") == 0;
}

json_t *ag__px_stored_request(ag_proxy *p, req_ctx *q, const json_t *req,
                              const char *path, char *why, size_t cap) {
  const ag__wire *w = q->r.shape;
  fetch f = {.p = p, .q = q, .why = why, .why_cap = cap};
  why[0] = '\0';
  const char *qm = strchr(q->uri, '?');
  f.query = qm != NULL ? qm + 1 : "";
  size_t pl = strlen(path);
  if (pl > 1 && path[pl - 1] == '/')
    pl--;
  while (pl > 0 && path[pl - 1] != '/')
    pl--;
  if (pl == 0 || pl >= sizeof f.base) {
    snprintf(why, cap, "the path has no base to read the conversation from");
    return NULL;
  }
  memcpy(f.base, path, pl - 1); /* without the '/' before the segment */
  f.base[pl - 1] = '\0';
  f.left = p->max_body;
  f.gets_left = FETCH_GETS_MAX;
  const char *first = ag__jstr(req, "previous_response_id", NULL);
  if (first != NULL && strlen(first) < sizeof f.walked[0])
    snprintf(f.walked[f.n_walked++], sizeof f.walked[0], "%s", first);
  json_t *all = json_array(), *seen = json_object(), *out = NULL;
  if (all == NULL || seen == NULL) {
    snprintf(why, cap, "out of memory");
  } else if (read_stored(&f, w, req, all, seen)) {
    /* oldest first, then the request's own items; outputs at the start
     * whose calls were not read (the reading stopped between a call and
     * its output) left out */
    json_t *items = json_array();
    const json_t *in = json_object_get(req, "input");
    bool ok = items != NULL;
    size_t i = json_array_size(all);
    while (i > 0 && orphan_output(json_array_get(all, i - 1)))
      i--;
    for (; ok && i > 0; i--)
      ok = json_array_append(items, json_array_get(all, i - 1)) == 0;
    if (ok && json_is_string(in))
      ok = json_array_append_new(items,
                                 json_pack("{s:s, s:s, s:O}", "type", "message",
                                           "role", "user", "content", in)) == 0;
    else if (ok && json_is_array(in))
      ok = json_array_extend(items, (json_t *)in) == 0;
    out = ok ? json_copy((json_t *)req) : NULL;
    ok = out != NULL && json_object_set(out, "input", items) == 0;
    if (ok) { /* absent is fine */
      json_object_del(out, "previous_response_id");
      json_object_del(out, "conversation");
    }
    json_decref(items);
    if (!ok) {
      json_decref(out);
      out = NULL;
      snprintf(why, cap, "out of memory");
    }
  }
  json_decref(all);
  json_decref(seen);
  return out;
}
