/*
 * tests/oom/oom.c - out-of-memory fault injection over the public API, as
 * SQLite's and curl's torture tests do it (issue 9).
 *
 * Each operation below is a short, complete use of the API that frees
 * everything it makes. The driver runs it once counting its allocations
 * (N), then once per injection point k, with allocation k failing
 * (failmalloc.c), and checks every run:
 *   - the operation succeeds, or reports out of memory: AG_ENOMEM, or a
 *     turn that ends failed with reason "out_of_memory" - never another
 *     error, never a wrong result;
 *   - nothing it allocated is left (the live-pointer table is empty);
 *   - no crash and no sanitizer report (the ASan build runs this too, with
 *     LeakSanitizer at exit).
 * k runs over every allocation up to 2,000, then with a stride that keeps
 * each operation near 2,500 runs (deterministic).
 *
 * Out of memory inside OpenSSL (SHA-256) is reported by the library as
 * AG_ECRYPTO, which it cannot tell from another OpenSSL failure; that is
 * accepted only when the failed allocation was OpenSSL's own.
 *
 * Usage: oom [OPERATION...]  (default: all). OOM_VERBOSE=1 prints each k.
 * Exit 0 when every run passed, 1 otherwise.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "failmalloc.h"

#define EXHAUSTIVE_UP_TO 2000
#define SAMPLED_RUNS 500

/* What a run of an operation came to. */
typedef enum { R_OK, R_NOMEM, R_WRONG } result;

/* Sets why[] and returns R_WRONG. */
static result wrong(char *why, size_t cap, const char *what, ag_err_t rc,
                    const ag_error_t *err) {
  snprintf(why, cap, "%s: %s (%s)", what, ag_err_name(rc),
           err != NULL ? err->msg : "");
  return R_WRONG;
}

/* AG_OK → R_OK, AG_ENOMEM → R_NOMEM, anything else R_WRONG. */
#define CHECK(call, what)                                                      \
  do {                                                                         \
    ag_err_t rc_ = (call);                                                     \
    if (rc_ == AG_ENOMEM) {                                                    \
      res = R_NOMEM;                                                           \
      goto done;                                                               \
    }                                                                          \
    if (rc_ == AG_ECRYPTO && ossl_failed()) {                                  \
      res = R_NOMEM;                                                           \
      goto done;                                                               \
    }                                                                          \
    if (rc_ != AG_OK) {                                                        \
      res = wrong(why, cap, what, rc_, &err);                                  \
      goto done;                                                               \
    }                                                                          \
  } while (0)

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      snprintf(why, cap, __VA_ARGS__);                                         \
      res = R_WRONG;                                                           \
      goto done;                                                               \
    }                                                                          \
  } while (0)

static bool ossl_failed(void) {
  fm_source from;
  return fm_failed(&from) && from == FM_FROM_OPENSSL;
}

/*
 * Texts an operation returns (dumps, reports, canonical forms) are kept
 * from its unarmed run, and every later run that succeeds must return
 * exactly the same: an allocation failure may end the operation, never
 * give a text with a part missing. Static storage: the driver's own
 * mallocs would count.
 */
#define REF_SLOTS 8
#define REF_MAX 16384
static bool reference_run; /* the unarmed run: record */
static char ref_text[REF_SLOTS][REF_MAX];

static bool same_text(int slot, const char *what, const char *text, char *why,
                      size_t cap) {
  if (reference_run) {
    snprintf(ref_text[slot], REF_MAX, "%s", text);
    return true;
  }
  if (strncmp(ref_text[slot], text, REF_MAX - 1) == 0)
    return true;
  size_t i = 0;
  while (ref_text[slot][i] == text[i])
    i++;
  snprintf(why, cap, "%s differs at byte %zu: \"%.60s\" instead of \"%.60s\"",
           what, i, text + i, ref_text[slot] + i);
  return false;
}

#define SAME(slot, what, text)                                                 \
  do {                                                                         \
    if (!same_text(slot, what, text, why, cap)) {                              \
      res = R_WRONG;                                                           \
      goto done;                                                               \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Operations                                                               */
/* ------------------------------------------------------------------------ */

static const char CONFIG_JSON[] =
    "{\"preset\": \"production\",\n"
    " \"loop\": {\"max_iterations\": 30, \"identical_call_limit\": 3,\n"
    "          \"max_turn_duration\": \"2m\"},\n"
    " \"errors\": {\"max_tool_errors\": 4,\n"
    "            \"error_prefixes\": [\"Error:\", \"FAILED\"]}}";

static result op_config(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_config cfg;
  char *out = NULL;
  ag_config_init(&cfg);
  CHECK(ag_config_parse(&cfg, CONFIG_JSON, strlen(CONFIG_JSON), &err),
        "ag_config_parse");
  EXPECT(cfg.loop.identical_call_limit == 3, "identical_call_limit %d",
         cfg.loop.identical_call_limit);
  CHECK(ag_config_to_json(&cfg, &out, &err), "ag_config_to_json");
  SAME(0, "ag_config_to_json", out);
  ag_config back;
  ag_config_init(&back);
  CHECK(ag_config_parse(&back, out, strlen(out), &err), "parse back");
  EXPECT(back.errors.max_tool_errors == 4, "max_tool_errors %d",
         back.errors.max_tool_errors);
  /* An error path: a misspelt key (its suggestion allocates nothing the
   * caller sees, but the parse allocates before it finds the key). */
  static const char BAD[] = "{\"errors\": {\"max_tol_errors\": 2}}";
  ag_err_t rc = ag_config_parse(&back, BAD, strlen(BAD), &err);
  if (rc == AG_ENOMEM) {
    res = R_NOMEM;
    goto done;
  }
  EXPECT(rc == AG_ECONFIG, "a misspelt key: %s", ag_err_name(rc));
done:
  ag_free(out);
  return res;
}

static const char *const ARGS[] = {
    "{\"path\": \"src/a.c\", \"line\": 10}",
    "{\"line\":10,\"path\":\"src/a.c\"}",
    "{\"cmd\": \"make test\", \"env\": {\"CC\": \"gcc\"}, \"n\": [1, 2.5e3]}",
};

static result op_guard(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_config cfg;
  ag_guard *g = NULL;
  char *dump = NULL, *rec = NULL;
  CHECK(ag_config_preset(&cfg, "default", &err), "ag_config_preset");
  cfg.loop.identical_call_limit = 3;
  ag_guard_opts gopts;
  ag_guard_opts_init(&gopts);
  gopts.max_args_bytes = 4096;
  gopts.max_args_tokens = 256;
  gopts.max_batch = 8;
  CHECK(ag_guard_new(&g, &cfg, &gopts, &err), "ag_guard_new");
  ag_guard_begin_turn(g, 0);
  ag_verdict v;
  ag_action last = AG_ALLOW;
  for (int i = 0; i < 4 && last == AG_ALLOW; i++) {
    if (ag_guard_begin_iteration(g, i, &v) != AG_ALLOW)
      break;
    ag_call calls[2] = {{"read_file", ARGS[i % 2], strlen(ARGS[i % 2])},
                        {"bash", ARGS[2], strlen(ARGS[2])}};
    ag_call_check ck[2];
    last = ag_guard_check_calls(g, calls, 2, i, ck, &v);
    if (last != AG_ALLOW)
      break;
    static const char ERR_TEXT[] = "Error: no such file or directory";
    ag_result rs[2] = {
        {"read_file", ck[0].sig, AG_OUTCOME_ERROR, ERR_TEXT, strlen(ERR_TEXT),
         AG_CAT_AUTO},
        {"bash", ck[1].sig, AG_OUTCOME_OK, "ok", 2, AG_CAT_AUTO},
    };
    last = ag_guard_record_results(g, rs, 2, i, &v);
    static const char TEXT[] = "Let me read the file again. ";
    ag_guard_check_text(g, TEXT, strlen(TEXT), true, &v);
  }
  /* The two spellings of read_file's arguments are one call: the third
   * time trips identical_call_limit. */
  EXPECT(last == AG_STOP || last == AG_ESCALATE, "the guard did not stop: %s",
         ag_reason_name(v.reason));
  CHECK(ag_guard_escalation_record(g, &v, &rec, &err),
        "ag_guard_escalation_record");
  CHECK(ag_guard_dump(g, &dump, &err), "ag_guard_dump");
  SAME(0, "the escalation record", rec);
  SAME(1, "the dump", dump);
  json_error_t jerr;
  json_t *j = json_loads(dump, 0, &jerr);
  if (j == NULL && fm_failed(NULL)) { /* this parse is the driver's own */
    res = R_NOMEM;
    goto done;
  }
  EXPECT(j != NULL, "the dump is not JSON: %s", jerr.text);
  json_decref(j);
done:
  ag_free(rec);
  ag_free(dump);
  ag_guard_free(g);
  return res;
}

static result op_jcs(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  char *out = NULL;
  size_t len = 0;
  uint8_t a[AG_SIG_LEN], b[AG_SIG_LEN];
  static const char DOC[] =
      "{\"z\": [1e21, 0.1, -0, 1E-7, \"\\u00e9\\ud83d\\ude00\"], "
      "\"a\": {\"b\": null, \"\\u20ac\": true, \"c\": 333333333.33333329}}";
  CHECK(ag_canonicalize(DOC, strlen(DOC), &out, &len, &err), "ag_canonicalize");
  SAME(0, "the canonical form", out);
  EXPECT(strncmp(out, "{\"a\":{\"b\":null", 14) == 0, "canonical: %s", out);
  CHECK(ag_signature("read_file", ARGS[0], strlen(ARGS[0]), a, &err),
        "ag_signature");
  CHECK(ag_signature("read_file", ARGS[1], strlen(ARGS[1]), b, &err),
        "ag_signature");
  EXPECT(memcmp(a, b, AG_SIG_LEN) == 0, "two spellings, two signatures");
  ag_err_t rc = ag_signature("x", "{\"a\":1,\"a\":2}", 13, a, &err);
  if (rc == AG_ENOMEM || (rc == AG_ECRYPTO && ossl_failed())) {
    res = R_NOMEM;
    goto done;
  }
  EXPECT(rc == AG_EDUPKEY, "duplicate key: %s", ag_err_name(rc));
done:
  ag_free(out);
  return res;
}

static const char TRAJECTORY[] =
    "[{\"role\": \"system\", \"content\": \"You fix bugs.\"},\n"
    " {\"role\": \"user\", \"content\": \"Make the tests pass.\"},\n"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
    "{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
    "\"bash\", \"arguments\": \"{\\\"command\\\": \\\"make test\\\"}\"}}]},\n"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"FAILED: "
    "test_a\"},\n"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
    "{\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": "
    "\"bash\", \"arguments\": \"{\\\"command\\\": \\\"make test\\\"}\"}}]},\n"
    " {\"role\": \"tool\", \"tool_call_id\": \"c2\", \"content\": \"FAILED: "
    "test_a\"},\n"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
    "{\"id\": \"c3\", \"type\": \"function\", \"function\": {\"name\": "
    "\"bash\", \"arguments\": \"{\\\"command\\\":\\\"make test\\\"}\"}}]},\n"
    " {\"role\": \"tool\", \"tool_call_id\": \"c3\", \"content\": \"FAILED: "
    "test_a\"},\n"
    " {\"role\": \"assistant\", \"content\": \"I give up.\"}]";

static result op_audit(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_trajectory *t = NULL;
  ag_auditor *a = NULL;
  ag_config cfg;
  CHECK(ag_trajectory_parse(&t, TRAJECTORY, strlen(TRAJECTORY), NULL, &err),
        "ag_trajectory_parse");
  CHECK(ag_config_preset(&cfg, "default", &err), "ag_config_preset");
  cfg.loop.identical_call_limit = 3;
  ag_audit_opts o;
  ag_audit_opts_init(&o);
  o.all_stops = true;
  CHECK(ag_auditor_new(&a, &cfg, &o, &err), "ag_auditor_new");
  ag_audit_finding f;
  CHECK(ag_auditor_run(a, t, &f, &err), "ag_auditor_run");
  EXPECT(f.steps == 4 && f.stop.stopped && f.stop.step == 3,
         "steps %d, stopped %d at step %d (%s)", f.steps, f.stop.stopped,
         f.stop.step, ag_reason_name(f.stop.reason));
done:
  ag_auditor_free(a);
  ag_trajectory_free(t);
  return res;
}

static const char TOOL_JSON[] =
    "{\"description\": \"Reads a file\", \"idempotent\": true,\n"
    " \"parameters\": {\"type\": \"object\", \"required\": [\"path\"],\n"
    "  \"additionalProperties\": false,\n"
    "  \"properties\": {\n"
    "   \"path\": {\"type\": \"string\", \"pattern\": \"^[a-z/]+\\\\.c$\",\n"
    "            \"maxLength\": 100},\n"
    "   \"mode\": {\"enum\": [\"text\", \"bytes\"]},\n"
    "   \"lines\": {\"type\": \"array\", \"maxItems\": 2,\n"
    "             \"items\": {\"type\": \"integer\", \"minimum\": 1}}}},\n"
    " \"command\": [\"cat\"]}";

static result op_registry(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_registry *r = NULL;
  json_t *tool = NULL, *good = NULL, *bad = NULL, *tools = NULL;
  char *text = NULL;
  json_error_t jerr;
  CHECK(ag_registry_new(&r, &err), "ag_registry_new");
  /* The driver's own JSON: a NULL under injection is out of memory. */
  tool = json_loads(TOOL_JSON, 0, &jerr);
  good = json_pack("{s:s, s:[i,i]}", "path", "src/a.c", "lines", 1, 2);
  bad = json_pack("{s:s, s:s}", "path", "src/a.h", "mode", "lines");
  if (tool == NULL || good == NULL || bad == NULL) {
    EXPECT(fm_failed(NULL), "the driver's JSON: %s", jerr.text);
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_registry_add_json(r, "read_file", tool, NULL, &err),
        "ag_registry_add_json");
  static const char FILE_JSON[] =
      "{\"grep\": {\"description\": \"Searches\", \"command\": [\"grep\", "
      "\"-rn\"], \"parameters\": {\"type\": \"object\", \"properties\": "
      "{\"q\": {\"type\": \"string\", \"minLength\": 1}}}}}";
  CHECK(ag_tools_file_load(r, FILE_JSON, strlen(FILE_JSON), &err),
        "ag_tools_file_load");
  CHECK(ag_registry_validate(r, "read_file", good, &err), "validate good");
  ag_err_t rc = ag_registry_validate(r, "read_file", bad, &err);
  if (rc == AG_ENOMEM) {
    res = R_NOMEM;
    goto done;
  }
  EXPECT(rc == AG_EINVAL && strstr(err.msg, "/path") != NULL,
         "validate bad: %s %s", ag_err_name(rc), err.msg);
  tools = ag_registry_tools_json(r);
  if (tools == NULL) {
    res = R_NOMEM;
    goto done;
  }
  EXPECT(json_array_size(tools) == 2, "%zu tools", json_array_size(tools));
  text = json_dumps(tools, JSON_COMPACT | JSON_SORT_KEYS);
  if (text == NULL) { /* the driver's own dump */
    EXPECT(fm_failed(NULL), "json_dumps failed");
    res = R_NOMEM;
    goto done;
  }
  SAME(0, "ag_registry_tools_json", text);
done:
  free(text);
  json_decref(tools);
  json_decref(bad);
  json_decref(good);
  json_decref(tool);
  ag_registry_free(r);
  return res;
}

static ag_tool_status echo_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  const char *p = json_string_value(json_object_get(args, "path"));
  ag_output_printf(out, "contents of %s: int main(void) { return 0; }",
                   p != NULL ? p : "?");
  return AG_TOOL_OK;
}

/* Two tool calls in parallel, a repeat of one, then the answer. */
static const char SCRIPT[] =
    "[{\"user\": \"Read a.c and b.c\", \"model\": [\n"
    " {\"text\": \"Reading.\", \"tool_calls\": [\n"
    "  {\"id\": \"c1\", \"name\": \"read_file\", \"arguments\": {\"path\": "
    "\"a.c\"}},\n"
    "  {\"id\": \"c2\", \"name\": \"read_file\", \"arguments\": "
    "\"{\\\"path\\\": \\\"b.c\\\"}\"}]},\n"
    " {\"tool_calls\": [{\"id\": \"c3\", \"name\": \"read_file\", "
    "\"arguments\": {\"path\": \"a.c\"}}]},\n"
    " {\"text\": \"Both files hold an empty main.\"}]}]";

/* Whether every history message is whole: a string "role"; an assistant's
 * calls with ids, names and argument strings; a tool message with the id
 * of a call before it. Writes what is wrong to why[]. */
static bool history_whole_tree(const json_t *h, char *why, size_t cap);

static bool history_whole(const ag_agent *a, char *why, size_t cap) {
  json_t *h = ag_agent_history(a);
  if (h == NULL) {
    /* the driver's own parse met the failing allocation */
    snprintf(why, cap, "the history does not parse");
    return fm_failed(NULL);
  }
  bool ok = history_whole_tree(h, why, cap);
  json_decref(h);
  return ok;
}

static bool history_whole_tree(const json_t *h, char *why, size_t cap) {
  size_t i;
  json_t *m;
  json_array_foreach(h, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (role == NULL) {
      snprintf(why, cap, "history[%zu] has no role", i);
      return false;
    }
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(m, "tool_calls"), k, c) {
      json_t *fn = json_object_get(c, "function");
      if (!json_is_string(json_object_get(c, "id")) ||
          !json_is_string(json_object_get(fn, "name")) ||
          !json_is_string(json_object_get(fn, "arguments"))) {
        snprintf(why, cap, "history[%zu].tool_calls[%zu] is not whole", i, k);
        return false;
      }
    }
    if (strcmp(role, "tool") == 0 &&
        (!json_is_string(json_object_get(m, "tool_call_id")) ||
         !json_is_string(json_object_get(m, "content")))) {
      snprintf(why, cap, "history[%zu] (tool) has no call id or content", i);
      return false;
    }
  }
  return true;
}

/* The history as text, compared with the unarmed run's (slot `slot`):
 * a turn that succeeded despite a failed allocation must have stored
 * exactly what it would have. R_NOMEM when the driver's own dump fails. */
static result same_history(const ag_agent *a, int slot, char *why, size_t cap) {
  json_t *h = ag_agent_history(a);
  char *text = h != NULL ? json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(h);
  if (text == NULL)
    return R_NOMEM;
  result res = same_text(slot, "the history", text, why, cap) ? R_OK : R_WRONG;
  free(text);
  return res;
}

static result op_agent(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_registry *r = NULL;
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  json_t *turns = NULL;
  ag_turn_outcome o;
  memset(&o, 0, sizeof(o));
  json_error_t jerr;
  turns = json_loads(SCRIPT, 0, &jerr);
  if (turns == NULL) {
    EXPECT(fm_failed(NULL), "the script: %s", jerr.text);
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_registry_new(&r, &err), "ag_registry_new");
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "read_file";
  d.description = "Reads a file";
  d.parameters = "{\"type\": \"object\", \"properties\": {\"path\": "
                 "{\"type\": \"string\"}}, \"required\": [\"path\"]}";
  d.fn = echo_tool;
  CHECK(ag_registry_add(r, &d, &err), "ag_registry_add");
  CHECK(ag_provider_scripted_new(&p, turns, &err), "ag_provider_scripted_new");
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  CHECK(ag_config_preset(&ao.config, "default", &err), "ag_config_preset");
  ao.config.retry.max_retries = 0;
  ao.config.network.max_retries = 0;
  ao.provider = p;
  ao.tools = r;
  ao.system_prompt = "You read files.";
  ao.seed = 1;
  ao.config.loop.max_parallel = 2; /* fewer threads to start per run */
  CHECK(ag_agent_new(&a, &ao, &err), "ag_agent_new");
  CHECK(ag_agent_run_turn(a, "Read a.c and b.c", NULL, &o, &err),
        "ag_agent_run_turn");
  if (o.status == AG_TURN_FAILED && strcmp(o.reason, "out_of_memory") == 0) {
    EXPECT(fm_failed(NULL), "out_of_memory with no failed allocation");
    res = R_NOMEM;
    goto done;
  }
  EXPECT(o.status == AG_TURN_COMPLETED && o.tool_calls == 3 &&
             o.final_text != NULL &&
             strcmp(o.final_text, "Both files hold an empty main.") == 0,
         "turn %s (%s: %s), %d calls, answer %s", ag_turn_status_name(o.status),
         o.reason, o.message, o.tool_calls,
         o.final_text != NULL ? o.final_text : "(none)");
  {
    json_t *h = ag_agent_history(a);
    size_t hn = json_array_size(h);
    json_decref(h);
    EXPECT(h == NULL || hn == 8, "history of %zu", hn);
  }
  res = same_history(a, 0, why, cap);
done:
  if (a != NULL && res != R_WRONG && !history_whole(a, why, cap))
    res = R_WRONG; /* also after ENOMEM: the session goes on */
  ag_turn_outcome_clear(&o);
  ag_agent_free(a);
  ag_provider_free(p);
  ag_registry_free(r);
  json_decref(turns);
  return res;
}

static result op_content(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_content_loop *d = NULL;
  ag_content_loop_opts o;
  ag_content_loop_opts_init(&o);
  CHECK(ag_content_loop_new(&d, &o, &err), "ag_content_loop_new");
  static const char LINE[] =
      "I will now check the configuration file once more.\n";
  bool found = false;
  for (int i = 0; i < 40 && !found; i++)
    found = ag_content_loop_feed(d, LINE, strlen(LINE));
  EXPECT(found, "no loop found");
  char chunk[128];
  EXPECT(ag_content_loop_chunk(d, chunk, sizeof(chunk)) > 0, "no chunk");
done:
  ag_content_loop_free(d);
  return res;
}

static ag_tool_status failing_tool(void *user, const json_t *args,
                                   ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  ag_output_printf(out, "Error: build failed at src/main.c:42: expected ';'");
  ag_output_set_transient(out, false);
  return AG_TOOL_ERROR;
}

static int events_seen;
static char bad_event[256]; /* the first event without all its fields */

/* Each event's own fields (docs/agent.md's table): an event is delivered
 * whole or not at all (turn_end's events_lost counts those not). */
static const struct {
  const char *event;
  const char *fields[8];
} event_fields[] = {
    {"turn_start", {"user"}},
    {"model_request", {"messages", "history_bytes", "error_context", "tools"}},
    {"provider_retry", {"attempt", "status", "message", "delay_ms"}},
    {"model_response", {"text", "tool_calls"}},
    {"tool_call", {"call_id", "name", "arguments", "signature"}},
    {"approval", {"call_id", "name", "approved"}},
    {"tool_blocked", {"call_id", "name", "reason"}},
    {"tool_attempt",
     {"call_id", "name", "attempt", "outcome", "message", "retry_in_ms"}},
    {"tool_result", {"call_id", "name", "ok", "attempts", "category", "text"}},
    {"error_context", {"text"}},
    {"nudge", {"reason", "text"}},
    {"warning", {"message"}},
    {"escalation", {"record"}},
    {"human", {"action", "message"}},
    {"turn_end",
     {"status", "reason", "message", "iterations", "tool_calls", "tokens",
      "final_text"}},
};

/* The first field `name`'s event lacks, or NULL. */
static const char *missing_field(const char *name, const json_t *ev) {
  for (size_t i = 0; i < sizeof(event_fields) / sizeof(event_fields[0]); i++) {
    if (strcmp(event_fields[i].event, name) != 0)
      continue;
    for (size_t k = 0; k < 8 && event_fields[i].fields[k] != NULL; k++)
      if (json_object_get(ev, event_fields[i].fields[k]) == NULL)
        return event_fields[i].fields[k];
    return NULL;
  }
  return "a known event name";
}

/* Under the agent's event lock (never concurrent). */
static void on_event(void *user, const json_t *ev) {
  (void)user;
  events_seen++;
  if (bad_event[0] != '\0')
    return;
  const char *name = json_string_value(json_object_get(ev, "event"));
  if (name == NULL || !json_is_integer(json_object_get(ev, "turn")) ||
      !json_is_integer(json_object_get(ev, "iteration")) ||
      !json_is_integer(json_object_get(ev, "t_ms"))) {
    snprintf(bad_event, sizeof(bad_event), "event %d (%s) without %s",
             events_seen, name != NULL ? name : "no name",
             name == NULL ? "\"event\"" : "turn, iteration or t_ms");
    return;
  }
  const char *miss = missing_field(name, ev);
  if (miss != NULL)
    snprintf(bad_event, sizeof(bad_event), "event %d (%s) without %s",
             events_seen, name, miss);
}

static ag_approval approve_all(void *user, const char *tool, const char *args,
                               size_t args_len, char *reason, size_t cap) {
  (void)user;
  (void)tool;
  (void)args;
  (void)args_len;
  (void)reason;
  (void)cap;
  return AG_APPROVE_ONCE;
}

/* Turn 1: the same failing build four times (the guard stops it); turn 2:
 * a provider error retried, then an answer. */
static const char STUCK_SCRIPT[] =
    "[{\"user\": \"Build it\", \"model\": [\n"
    "  {\"tool_calls\": [{\"id\": \"b\", \"name\": \"build\", \"arguments\": "
    "{\"target\": \"all\"}}]}], \"repeat_last\": true},\n"
    " {\"user\": \"Why?\", \"model\": [\n"
    "  {\"provider_error\": {\"status\": 503, \"retry_after_ms\": 1, "
    "\"message\": \"Service Unavailable\"}},\n"
    "  {\"text\": \"The build fails on a missing semicolon.\"}]}]";

/* The guard stopping a stuck agent, with events, approvals, the error
 * context and a retried provider error, over two turns of one session. */
static result op_agent_stuck(char *why, size_t cap) {
  result res = R_OK;
  events_seen = 0;
  bad_event[0] = '\0';
  ag_error_t err = {0};
  ag_registry *r = NULL;
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  json_t *turns = NULL;
  ag_turn_outcome o;
  memset(&o, 0, sizeof(o));
  json_error_t jerr;
  turns = json_loads(STUCK_SCRIPT, 0, &jerr);
  if (turns == NULL) {
    EXPECT(fm_failed(NULL), "the script: %s", jerr.text);
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_registry_new(&r, &err), "ag_registry_new");
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "build";
  d.description = "Builds a target";
  d.fn = failing_tool;
  d.requires_approval = true;
  CHECK(ag_registry_add(r, &d, &err), "ag_registry_add");
  CHECK(ag_provider_scripted_new(&p, turns, &err), "ag_provider_scripted_new");
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  CHECK(ag_config_preset(&ao.config, "default", &err), "ag_config_preset");
  ao.config.loop.identical_call_limit = 3;
  ao.config.retry.max_retries = 0;
  ao.config.network.max_retries = 2;
  ao.config.network.delay_ms = 1;
  ao.config.network.max_delay_ms = 1;
  ao.provider = p;
  ao.tools = r;
  ao.approve = approve_all;
  ao.on_event = on_event;
  ao.events_full = true;
  ao.seed = 1;
  ao.config.loop.max_parallel = 2; /* fewer threads to start per run */
  CHECK(ag_agent_new(&a, &ao, &err), "ag_agent_new");
  static const char *const USER[2] = {"Build it", "Why?"};
  static const ag_turn_status WANT[2] = {AG_TURN_STOPPED, AG_TURN_COMPLETED};
  /* A turn that ran out of memory leaves the session ready for the next
   * (agent.h): the second turn runs after a failed first one too. */
  for (int t = 0; t < 2; t++) {
    ag_turn_outcome_clear(&o);
    CHECK(ag_agent_run_turn(a, USER[t], NULL, &o, &err), "ag_agent_run_turn");
    if (o.status == AG_TURN_FAILED && strcmp(o.reason, "out_of_memory") == 0) {
      EXPECT(fm_failed(NULL), "out_of_memory with no failed allocation");
      res = R_NOMEM;
      continue;
    }
    EXPECT(o.status == WANT[t], "turn %d: %s (%s: %s)", t + 1,
           ag_turn_status_name(o.status), o.reason, o.message);
  }
  EXPECT(res == R_NOMEM ||
             (o.final_text != NULL &&
              strcmp(o.final_text, "The build fails on a missing semicolon.") ==
                  0),
         "answer %s", o.final_text != NULL ? o.final_text : "(none)");
  if (res == R_OK)
    res = same_history(a, 0, why, cap);
done:
  if (bad_event[0] != '\0' && res != R_WRONG) { /* also after ENOMEM */
    snprintf(why, cap, "%s", bad_event);
    res = R_WRONG;
  }
  if (a != NULL && res != R_WRONG && !history_whole(a, why, cap))
    res = R_WRONG;
  ag_turn_outcome_clear(&o);
  ag_agent_free(a);
  ag_provider_free(p);
  ag_registry_free(r);
  json_decref(turns);
  return res;
}

static ag_tool_status flaky_tool(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  ag_output_printf(out, "503 Service Unavailable");
  return AG_TOOL_ERROR;
}

static int human_calls;

static ag_human_action human(void *user, const char *record, char *hint,
                             size_t cap) {
  (void)user;
  (void)record;
  if (human_calls++ == 0) {
    snprintf(hint, cap, "Use the cached copy instead.");
    return AG_HUMAN_CONTINUE;
  }
  return AG_HUMAN_STOP;
}

static const char ESCALATE_SCRIPT[] =
    "[{\"user\": \"Fetch the report\", \"model\": [\n"
    "  {\"text\": \"Fetching.\", \"tool_calls\": [{\"id\": \"f\", \"name\": "
    "\"fetch\", \"arguments\": {\"url\": \"https://example.com/r\"}}]}],\n"
    "  \"repeat_last\": true}]";

/* A transient tool error retried (retry.c), the guard escalating to a
 * human who first continues with a hint, then stops. */
static result op_escalate(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_registry *r = NULL;
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  json_t *turns = NULL;
  ag_turn_outcome o;
  memset(&o, 0, sizeof(o));
  human_calls = 0;
  json_error_t jerr;
  turns = json_loads(ESCALATE_SCRIPT, 0, &jerr);
  if (turns == NULL) {
    EXPECT(fm_failed(NULL), "the script: %s", jerr.text);
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_registry_new(&r, &err), "ag_registry_new");
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "fetch";
  d.description = "Fetches a URL";
  d.fn = flaky_tool;
  d.idempotent = true;
  CHECK(ag_registry_add(r, &d, &err), "ag_registry_add");
  CHECK(ag_provider_scripted_new(&p, turns, &err), "ag_provider_scripted_new");
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  CHECK(ag_config_preset(&ao.config, "default", &err), "ag_config_preset");
  ao.config.loop.identical_call_limit = 3;
  ao.config.errors.on_trip = AG_TRIP_ESCALATE;
  ao.config.retry.max_retries = 1;
  ao.config.retry.delay_ms = 1;
  ao.config.retry.max_delay_ms = 1;
  ao.provider = p;
  ao.tools = r;
  ao.human = human;
  ao.seed = 1;
  ao.config.loop.max_parallel = 2; /* fewer threads to start per run */
  CHECK(ag_agent_new(&a, &ao, &err), "ag_agent_new");
  CHECK(ag_agent_run_turn(a, "Fetch the report", NULL, &o, &err),
        "ag_agent_run_turn");
  if (o.status == AG_TURN_FAILED && strcmp(o.reason, "out_of_memory") == 0) {
    EXPECT(fm_failed(NULL), "out_of_memory with no failed allocation");
    res = R_NOMEM;
    goto done;
  }
  EXPECT(o.status == AG_TURN_ESCALATED && human_calls == 2,
         "turn %s (%s: %s), the human asked %d times",
         ag_turn_status_name(o.status), o.reason, o.message, human_calls);
  res = same_history(a, 0, why, cap);
done:
  if (a != NULL && res != R_WRONG && !history_whole(a, why, cap))
    res = R_WRONG; /* also after ENOMEM: the session goes on */
  ag_turn_outcome_clear(&o);
  ag_agent_free(a);
  ag_provider_free(p);
  ag_registry_free(r);
  json_decref(turns);
  return res;
}

static char workdir[256]; /* made by main for op_builtin */

static const char BUILTIN_SCRIPT[] =
    "[{\"user\": \"Fix the typo\", \"model\": [\n"
    " {\"tool_calls\": [{\"id\": \"w\", \"name\": \"write_file\", "
    "\"arguments\": {\"path\": \"notes/a.txt\", \"content\": "
    "\"helo world\\nsecond line\\n\"}}]},\n"
    " {\"tool_calls\": [{\"id\": \"e\", \"name\": \"edit_file\", "
    "\"arguments\": {\"path\": \"notes/a.txt\", \"old_string\": \"helo\", "
    "\"new_string\": \"hello\"}}]},\n"
    " {\"tool_calls\": [\n"
    "  {\"id\": \"r\", \"name\": \"read_file\", \"arguments\": {\"path\": "
    "\"notes/a.txt\", \"start_line\": 1}},\n"
    "  {\"id\": \"l\", \"name\": \"list_dir\", \"arguments\": {\"path\": "
    "\"notes\"}},\n"
    "  {\"id\": \"s\", \"name\": \"search_text\", \"arguments\": "
    "{\"pattern\": \"w.rld\", \"regex\": true}},\n"
    "  {\"id\": \"x\", \"name\": \"read_file\", \"arguments\": {\"path\": "
    "\"../etc/passwd\"}}]},\n"
    " {\"text\": \"Fixed.\"}]}]";

/* The built-in file tools in a workdir, driven by an agent. */
static result op_builtin(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_registry *r = NULL;
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  json_t *turns = NULL;
  ag_turn_outcome o;
  memset(&o, 0, sizeof(o));
  json_error_t jerr;
  turns = json_loads(BUILTIN_SCRIPT, 0, &jerr);
  if (turns == NULL) {
    EXPECT(fm_failed(NULL), "the script: %s", jerr.text);
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_registry_new(&r, &err), "ag_registry_new");
  ag_builtin_opts bo;
  ag_builtin_opts_init(&bo);
  bo.workdir = workdir;
  CHECK(ag_builtin_register(r, &bo, &err), "ag_builtin_register");
  CHECK(ag_provider_scripted_new(&p, turns, &err), "ag_provider_scripted_new");
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  CHECK(ag_config_preset(&ao.config, "default", &err), "ag_config_preset");
  ao.config.retry.max_retries = 0;
  ao.provider = p;
  ao.tools = r;
  ao.seed = 1;
  ao.config.loop.max_parallel = 2; /* fewer threads to start per run */
  CHECK(ag_agent_new(&a, &ao, &err), "ag_agent_new");
  CHECK(ag_agent_run_turn(a, "Fix the typo", NULL, &o, &err),
        "ag_agent_run_turn");
  if (o.status == AG_TURN_FAILED && strcmp(o.reason, "out_of_memory") == 0) {
    EXPECT(fm_failed(NULL), "out_of_memory with no failed allocation");
    res = R_NOMEM;
    goto done;
  }
  EXPECT(o.status == AG_TURN_COMPLETED && o.tool_calls == 6,
         "turn %s (%s: %s), %d calls", ag_turn_status_name(o.status), o.reason,
         o.message, o.tool_calls);
  /* Without a failure the edit went through; with one, a tool may have
   * answered with an error the model saw. */
  if (!fm_failed(NULL)) {
    json_t *h = ag_agent_history(a);
    json_t *m = json_array_get(h, 6); /* read_file's result */
    const char *text = json_string_value(json_object_get(m, "content"));
    bool found = (text != NULL && strstr(text, "hello world") != NULL) ||
                 (h == NULL && fm_failed(NULL)); /* the driver's parse */
    json_decref(h);
    EXPECT(found, "read_file: %s", found ? "" : "no hello world");
  }
done:
  if (a != NULL && res != R_WRONG && !history_whole(a, why, cap))
    res = R_WRONG; /* also after ENOMEM: the session goes on */
  ag_turn_outcome_clear(&o);
  ag_agent_free(a);
  ag_provider_free(p);
  ag_registry_free(r);
  json_decref(turns);
  return res;
}

static const char CMD_TOOLS[] =
    "{\"echo_args\": {\"description\": \"Prints its arguments\",\n"
    "  \"command\": [\"cat\"], \"env\": {\"LC_ALL\": \"C\"},\n"
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"n\": "
    "{\"type\": \"integer\"}}}}}";

static const char CMD_SCRIPT[] =
    "[{\"user\": \"Echo\", \"model\": [\n"
    " {\"tool_calls\": [{\"id\": \"a\", \"name\": \"echo_args\", "
    "\"arguments\": {\"n\": 1}}]},\n"
    " {\"text\": \"Done.\"}]}]";

/* A subprocess tool from a tools file: fork, exec, stdin, captured output. */
static result op_subprocess(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_registry *r = NULL;
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  json_t *turns = NULL;
  ag_turn_outcome o;
  memset(&o, 0, sizeof(o));
  json_error_t jerr;
  turns = json_loads(CMD_SCRIPT, 0, &jerr);
  if (turns == NULL) {
    EXPECT(fm_failed(NULL), "the script: %s", jerr.text);
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_registry_new(&r, &err), "ag_registry_new");
  CHECK(ag_tools_file_load(r, CMD_TOOLS, strlen(CMD_TOOLS), &err),
        "ag_tools_file_load");
  CHECK(ag_provider_scripted_new(&p, turns, &err), "ag_provider_scripted_new");
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  CHECK(ag_config_preset(&ao.config, "default", &err), "ag_config_preset");
  ao.config.retry.max_retries = 0;
  ao.provider = p;
  ao.tools = r;
  ao.seed = 1;
  ao.config.loop.max_parallel = 2; /* fewer threads to start per run */
  CHECK(ag_agent_new(&a, &ao, &err), "ag_agent_new");
  CHECK(ag_agent_run_turn(a, "Echo", NULL, &o, &err), "ag_agent_run_turn");
  if (o.status == AG_TURN_FAILED && strcmp(o.reason, "out_of_memory") == 0) {
    EXPECT(fm_failed(NULL), "out_of_memory with no failed allocation");
    res = R_NOMEM;
    goto done;
  }
  EXPECT(o.status == AG_TURN_COMPLETED && o.tool_calls == 1,
         "turn %s (%s: %s), %d calls", ag_turn_status_name(o.status), o.reason,
         o.message, o.tool_calls);
  if (!fm_failed(NULL)) {
    json_t *h = ag_agent_history(a);
    json_t *m = json_array_get(h, 2); /* the result */
    const char *text = json_string_value(json_object_get(m, "content"));
    bool found = (text != NULL && strstr(text, "\"n\"") != NULL) ||
                 (h == NULL && fm_failed(NULL)); /* the driver's parse */
    json_decref(h);
    EXPECT(found, "cat said %s", found ? "" : "no \"n\"");
  }
done:
  if (a != NULL && res != R_WRONG && !history_whole(a, why, cap))
    res = R_WRONG; /* also after ENOMEM: the session goes on */
  ag_turn_outcome_clear(&o);
  ag_agent_free(a);
  ag_provider_free(p);
  ag_registry_free(r);
  json_decref(turns);
  return res;
}

static const char PROVIDER_JSON[] =
    "{\"kind\": \"openai\", \"base_url\": \"http://127.0.0.1:9/v1\",\n"
    " \"model\": \"small-model\", \"api_key_env\": \"AG_OOM_NO_SUCH_KEY\",\n"
    " \"headers\": {\"X-Team\": \"tools\", \"X-Trace\": \"on\"},\n"
    " \"timeout\": \"30s\", \"connect_timeout\": \"250ms\", \"stream\": true,\n"
    " \"temperature\": 0.2, \"max_tokens\": 512,\n"
    " \"extra_body\": {\"seed\": 7, \"top_p\": 0.9}}";

/* A provider section parsed, and an HTTP provider made from it (no request
 * is sent). */
static result op_provider(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_provider_config *c = NULL;
  ag_provider *p = NULL;
  CHECK(
      ag_provider_config_parse(&c, PROVIDER_JSON, strlen(PROVIDER_JSON), &err),
      "ag_provider_config_parse");
  bool timeout_set = false;
  const ag_http_provider_opts *o = ag_provider_config_opts(c, &timeout_set);
  EXPECT(o != NULL && timeout_set, "no options, or no timeout");
  CHECK(ag_provider_http_new(&p, o, &err), "ag_provider_http_new");
  static const char BAD[] = "{\"kind\": \"openai\", \"modle\": \"x\"}";
  ag_provider_config *bad = NULL;
  ag_err_t rc = ag_provider_config_parse(&bad, BAD, strlen(BAD), &err);
  ag_provider_config_free(bad);
  if (rc == AG_ENOMEM) {
    res = R_NOMEM;
    goto done;
  }
  EXPECT(rc == AG_ECONFIG && strstr(err.msg, "model") != NULL,
         "a misspelt key: %s %s", ag_err_name(rc), err.msg);
done:
  ag_provider_free(p);
  ag_provider_config_free(c);
  return res;
}

/* Four turns of about 400 bytes each under a 1,200-byte history cap: the
 * oldest turns are dropped as the session goes on. */
static result op_history_cap(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  json_t *turns = NULL;
  ag_turn_outcome o;
  memset(&o, 0, sizeof(o));
  char answer[400]; /* numbers: no chunk repeats (content_loop) */
  size_t used = 0;
  for (int i = 1000; used + 6 < sizeof(answer); i += 7)
    used += (size_t)snprintf(answer + used, sizeof(answer) - used, "%d ", i);
  turns = json_pack("[{s:s, s:[{s:s}]}, {s:s, s:[{s:s}]}, {s:s, s:[{s:s}]}, "
                    "{s:s, s:[{s:s}]}]",
                    "user", "Say x.", "model", "text", answer, "user", "Say x.",
                    "model", "text", answer, "user", "Say x.", "model", "text",
                    answer, "user", "Say x.", "model", "text", answer);
  if (turns == NULL) {
    EXPECT(fm_failed(NULL), "json_pack failed");
    res = R_NOMEM;
    goto done;
  }
  CHECK(ag_provider_scripted_new(&p, turns, &err), "ag_provider_scripted_new");
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  CHECK(ag_config_preset(&ao.config, "default", &err), "ag_config_preset");
  ao.provider = p;
  ao.max_history_bytes = 1200;
  ao.seed = 1;
  ao.config.loop.max_parallel = 1;
  CHECK(ag_agent_new(&a, &ao, &err), "ag_agent_new");
  for (int t = 0; t < 4; t++) {
    ag_turn_outcome_clear(&o);
    CHECK(ag_agent_run_turn(a, "Say x.", NULL, &o, &err), "ag_agent_run_turn");
    if (o.status == AG_TURN_FAILED && strcmp(o.reason, "out_of_memory") == 0) {
      EXPECT(fm_failed(NULL), "out_of_memory with no failed allocation");
      res = R_NOMEM;
      goto done;
    }
    EXPECT(o.status == AG_TURN_COMPLETED, "turn %d: %s (%s: %s)", t + 1,
           ag_turn_status_name(o.status), o.reason, o.message);
  }
  res = same_history(a, 0, why, cap);
done:
  ag_turn_outcome_clear(&o);
  ag_agent_free(a);
  ag_provider_free(p);
  json_decref(turns);
  return res;
}

/* An agentguard event log (JSON Lines), audited, with the JSON reports. */
static const char EVENT_LOG[] =
    "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":1,"
    "\"user\":\"Deploy.\"}\n"
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":5,"
    "\"text\":null,\"tool_calls\":[{\"id\":\"c1\",\"name\":\"deploy\","
    "\"arguments\":\"{\\\"env\\\":\\\"prod\\\"}\"}]}\n"
    "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":6,"
    "\"call_id\":\"c1\",\"name\":\"deploy\",\"arguments\":"
    "\"{\\\"env\\\":\\\"prod\\\"}\"}\n"
    "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":9,"
    "\"call_id\":\"c1\",\"name\":\"deploy\",\"ok\":false,\"attempts\":1,"
    "\"category\":\"network\",\"text\":\"Error: connection refused\"}\n"
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":15,"
    "\"text\":null,\"tool_calls\":[{\"id\":\"c2\",\"name\":\"deploy\","
    "\"arguments\":\"{\\\"env\\\": \\\"prod\\\"}\"}]}\n"
    "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":2,\"t_ms\":16,"
    "\"call_id\":\"c2\",\"name\":\"deploy\",\"arguments\":"
    "\"{\\\"env\\\": \\\"prod\\\"}\"}\n"
    "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":2,\"t_ms\":19,"
    "\"call_id\":\"c2\",\"name\":\"deploy\",\"ok\":false,\"attempts\":1,"
    "\"category\":\"network\",\"text\":\"Error: connection refused\"}\n"
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":3,\"t_ms\":25,"
    "\"text\":\"It is down.\",\"tool_calls\":[]}\n"
    "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":3,\"t_ms\":26,"
    "\"status\":\"completed\",\"reason\":\"final_answer\",\"message\":\"The "
    "model answered.\",\"iterations\":3,\"tool_calls\":2,\"final_text\":\"It "
    "is down.\"}\n";

static result op_audit_events(char *why, size_t cap) {
  result res = R_OK;
  ag_error_t err = {0};
  ag_trajectory *t = NULL;
  ag_auditor *a = NULL;
  char *line = NULL, *sum = NULL;
  ag_config cfg;
  CHECK(ag_trajectory_parse(&t, EVENT_LOG, strlen(EVENT_LOG), NULL, &err),
        "ag_trajectory_parse");
  CHECK(ag_config_preset(&cfg, "default", &err), "ag_config_preset");
  cfg.errors.max_identical_errors = 2;
  CHECK(ag_auditor_new(&a, &cfg, NULL, &err), "ag_auditor_new");
  ag_audit_finding f;
  CHECK(ag_auditor_run(a, t, &f, &err), "ag_auditor_run");
  EXPECT(f.steps == 3 && f.stop.stopped && f.stop.step == 2,
         "steps %d, stopped %d at step %d (%s)", f.steps, f.stop.stopped,
         f.stop.step, ag_reason_name(f.stop.reason));
  CHECK(ag_audit_finding_json("deploy.jsonl", "default", t, &f, &line, &err),
        "ag_audit_finding_json");
  ag_audit_summary s;
  ag_audit_summary_init(&s);
  ag_audit_summary_add(&s, t, &f);
  CHECK(ag_audit_summary_json("default", &s, &sum, &err),
        "ag_audit_summary_json");
  EXPECT(strstr(line, "\"type\":\"run\"") != NULL &&
             strstr(sum, "\"type\":\"summary\"") != NULL,
         "reports %s / %s", line, sum);
  SAME(0, "the run report", line);
  SAME(1, "the summary report", sum);
done:
  ag_free(sum);
  ag_free(line);
  ag_auditor_free(a);
  ag_trajectory_free(t);
  return res;
}

/* ------------------------------------------------------------------------ */
/* The driver                                                               */
/* ------------------------------------------------------------------------ */

typedef struct operation {
  const char *name;
  result (*run)(char *why, size_t cap);
} operation;

static const operation OPS[] = {
    {"config", op_config},
    {"guard", op_guard},
    {"jcs", op_jcs},
    {"audit", op_audit},
    {"registry", op_registry},
    {"agent", op_agent},
    {"content", op_content},
    {"agent_stuck", op_agent_stuck},
    {"builtin", op_builtin},
    {"audit_events", op_audit_events},
    {"subprocess", op_subprocess},
    {"escalate", op_escalate},
    {"provider", op_provider},
    {"history_cap", op_history_cap},
};

static bool verbose;
static bool warming; /* the first, unchecked-for-leaks run of an operation */

/* One run with allocation k failing (0: none), and with `persistent` every
 * one after it. Returns whether it passed; *count gets the allocations
 * counted. */
static bool run_once(const operation *op, long k, bool persistent,
                     long *count) {
  char why[1024] = "";
  fm_begin(k, persistent);
  result r = op->run(why, sizeof(why));
  fm_end();
  *count = fm_count();
  size_t first = 0;
  long live = fm_live(&first);
  fm_source from;
  bool hit = fm_failed(&from);
  bool ok = true;
  const char *mode = persistent ? " (and after)" : "";
  if (r == R_WRONG) {
    fprintf(stderr, "FAIL %s k=%ld%s: %s\n", op->name, k, mode, why);
    ok = false;
  } else if (r == R_NOMEM && !hit) {
    fprintf(stderr, "FAIL %s k=%ld%s: out of memory, but nothing failed\n",
            op->name, k, mode);
    ok = false;
  }
  if (live != 0 && !warming) {
    fprintf(stderr,
            "FAIL %s k=%ld%s: %ld allocations leaked (one of %zu bytes)%s\n",
            op->name, k, mode, live, first,
            r == R_NOMEM ? " after ENOMEM" : "");
    ok = false;
  }
  if (verbose)
    fprintf(stderr, "%s k=%ld%s: %s%s, %ld allocations\n", op->name, k, mode,
            r == R_OK      ? "ok"
            : r == R_NOMEM ? "ENOMEM"
                           : "WRONG",
            hit ? (from == FM_FROM_JANSSON   ? " (jansson failed)"
                   : from == FM_FROM_OPENSSL ? " (OpenSSL failed)"
                                             : " (malloc failed)")
                : "",
            *count);
  return ok;
}

static bool run_op(const operation *op, long *points) {
  long n = 0;
  /* Twice unarmed: the first run may fill process-wide caches that live
   * until exit (OpenSSL's algorithm fetch, curl's global init, the
   * classifier's index), so only the second must free everything. */
  warming = reference_run = true;
  bool warm = run_once(op, 0, false, &n);
  warming = false;
  bool ref = run_once(op, 0, false, &n);
  reference_run = false;
  if (!warm || !ref) {
    fprintf(stderr, "%s: fails with no injected failure\n", op->name);
    return false;
  }
  long stride = 1;
  if (n > EXHAUSTIVE_UP_TO)
    stride = (n - EXHAUSTIVE_UP_TO) / SAMPLED_RUNS + 1;
  long runs = 0, failures = 0;
  for (long k = 1; k <= n; k += k < EXHAUSTIVE_UP_TO ? 1 : stride) {
    for (int persistent = 0; persistent < 2; persistent++) {
      long c = 0;
      runs++;
      if (!run_once(op, k, persistent, &c))
        failures++;
    }
  }
  printf("%-9s %6ld allocations, %5ld runs (every k%s, once and from k on), "
         "%ld failed\n",
         op->name, n, runs, stride > 1 ? " sampled" : "", failures);
  *points += runs;
  return failures == 0;
}

int main(int argc, char **argv) {
  if (!fm_install()) {
    fprintf(stderr, "oom: OpenSSL refused the allocator hooks\n");
    return 1;
  }
  verbose = getenv("OOM_VERBOSE") != NULL;
  /* op_builtin's workdir: made (and removed) outside any run. */
  const char *tmp = getenv("TMPDIR");
  snprintf(workdir, sizeof(workdir), "%s/agentguard-oom-XXXXXX",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (mkdtemp(workdir) == NULL) {
    perror("oom: mkdtemp");
    return 1;
  }
  bool all_ok = true;
  long points = 0;
  size_t nops = sizeof(OPS) / sizeof(OPS[0]);
  for (size_t i = 0; i < nops; i++) {
    bool wanted = argc < 2;
    for (int a = 1; a < argc; a++)
      wanted = wanted || strcmp(argv[a], OPS[i].name) == 0;
    if (wanted && !run_op(&OPS[i], &points))
      all_ok = false;
  }
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", workdir);
  if (system(cmd) != 0)
    fprintf(stderr, "oom: could not remove %s\n", workdir);
  printf("%ld injection points, %s\n", points,
         all_ok ? "all passed" : "FAILURES");
  return all_ok ? 0 : 1;
}
