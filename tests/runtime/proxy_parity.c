/*
 * proxy_parity.c - the proxy decides as the audit does, and its tape reader as
 * the jansson tree (test_proxy's cases; the fake upstream, the proxy under test
 * and the client are proxy_fixture.h's).
 */
#include "proxy_fixture.h"

/* ---- parity with the audit ------------------------------------------------
 */

/* A random turn: rounds of 0-3 calls from a small set (so that repeats,
 * cycles and error runs happen), results ok, "Error: ..." or is_error. */
static json_t *random_turn(int rounds) {
  static const char *const names[] = {"read", "write", "run"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"p\": 1}",
                                     "{\"q\":[1,2]}"};
  json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system",
                           "content", "sys", "role", "user", "content", "go");
  int id = 0;
  for (int r = 0; r < rounds; r++) {
    unsigned nc = rnd(4);
    json_t *tcs = json_array();
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      json_array_append_new(tcs, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id",
                                           cid, "type", "function", "function",
                                           "name", names[rnd(3)], "arguments",
                                           args[rnd(4)]));
    }
    json_t *am = json_pack("{s:s, s:s}", "role", "assistant", "content",
                           rnd(3) == 0 ? "thinking" : "");
    if (nc > 0)
      json_object_set_new(am, "tool_calls", tcs);
    else
      json_decref(tcs);
    json_array_append_new(msgs, am);
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      unsigned kind = rnd(4);
      json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                             cid, "content",
                             kind == 0   ? "Error: file not found"
                             : kind == 1 ? "failed hard"
                                         : "ok");
      if (kind == 1)
        json_object_set_new(tm, "is_error", json_true());
      json_array_append_new(msgs, tm);
    }
    id += (int)nc;
  }
  return msgs;
}

/* The audit of `transcript` and the proxy's decision on `body` (the same
 * turn) agree: both stop, for the same reason, or neither. Returns 1 when
 * they stop. */
static int audit_equals_decision(ag_auditor *a, const ag_config *cfg,
                                 const char *transcript, const char *body,
                                 bool anthropic, int c, int i) {
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(
      ag_trajectory_parse(&t, transcript, strlen(transcript), NULL, &err),
      AG_OK, "%s", err.msg);
  ag_audit_finding f;
  cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK);
  ag_trajectory_free(t);
  ag_verdict v;
  int act = ag_proxy_decide(cfg, body, strlen(body), anthropic, &v, &err);
  if (!f.stop.stopped) {
    cr_expect_eq(act, AG_ALLOW, "cfg %d run %d: %s (%s)", c, i,
                 ag_reason_name(v.reason), transcript);
    return 0;
  }
  cr_expect(act == AG_STOP || act == AG_ESCALATE, "cfg %d run %d: %s", c, i,
            transcript);
  cr_expect_eq(v.reason, f.stop.reason, "cfg %d run %d: %s vs %s: %s", c, i,
               ag_reason_name(v.reason), ag_reason_name(f.stop.reason),
               transcript);
  return 1;
}

Test(proxy, decisions_equal_the_audits) {
  ag_config cfgs[3];
  cfgs[0] = test_cfg();
  cr_assert_eq(ag_config_preset(&cfgs[1], "default", NULL), AG_OK);
  cfgs[2] = test_cfg();
  cfgs[2].loop.nudge_before_stop = true;
  cfgs[2].loop.cycle_limit = 2;
  int stops = 0;
  for (int c = 0; c < 3; c++) {
    cfgs[c].loop.max_iterations = 0; /* the coming request never trips */
    cfgs[c].loop.max_tokens_per_turn = 0;
    ag_auditor *a = NULL;
    cr_assert_eq(ag_auditor_new(&a, &cfgs[c], NULL, NULL), AG_OK);
    for (int i = 0; i < 200; i++) {
      json_t *msgs = random_turn(1 + (int)rnd(12));
      char *transcript = json_dumps(msgs, JSON_COMPACT);
      json_t *req = json_pack("{s:s, s:o}", "model", "m", "messages", msgs);
      char *body = json_dumps(req, JSON_COMPACT);
      json_decref(req);
      stops +=
          audit_equals_decision(a, &cfgs[c], transcript, body, false, c, i);
      free(transcript);
      free(body);
    }
    ag_auditor_free(a);
  }
  cr_expect_gt(stops, 50, "the random turns exercise stops (%d)", stops);
}

/* A random turn as a pair: Chat Completions messages and the same turn in
 * Anthropic's shape (text in one block or split over two, results as a
 * string or as text blocks, an earlier turn before it), so that the
 * Anthropic reading (fast_turn_anth, or the conversion) can be held to the
 * chat one. */
static void random_pair(int rounds, json_t **chat, json_t **anth) {
  static const char *const names[] = {"read", "write", "run"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"q\":[1,2]}"};
  *chat = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content",
                    "sys", "role", "user", "content", "go");
  /* an earlier turn (its call and result), then the user message that
   * starts this turn, with a late result of the earlier call beside it */
  *anth = json_pack(
      "[{s:s, s:s}, {s:s, s:[{s:s, s:s, s:s, s:{}}]}, {s:s, s:[{s:s, s:s, "
      "s:s}, {s:s, s:s}]}]",
      "role", "user", "content", "before", "role", "assistant", "content",
      "type", "tool_use", "id", "old", "name", "read", "input", "role", "user",
      "content", "type", "tool_result", "tool_use_id", "old", "content",
      "Error: old", "type", "text", "text", "go");
  int id = 0;
  for (int r = 0; r < rounds; r++) {
    unsigned nc = rnd(4);
    unsigned textk = rnd(3); /* no text, one block, two blocks */
    char text[64] = "";
    json_t *blocks = json_array();
    if (textk == 1) {
      snprintf(text, sizeof text, "thinking");
      json_array_append_new(
          blocks, json_pack("{s:s, s:s}", "type", "text", "text", "thinking"));
    } else if (textk == 2) {
      snprintf(text, sizeof text, "a\nb");
      json_array_append_new(
          blocks, json_pack("{s:s, s:s}", "type", "text", "text", "a"));
      json_array_append_new(
          blocks, json_pack("{s:s, s:s}", "type", "text", "text", "b"));
    }
    json_t *tcs = json_array(), *results = json_array();
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      const char *nm = names[rnd(3)], *ar = args[rnd(3)];
      json_array_append_new(tcs, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id",
                                           cid, "type", "function", "function",
                                           "name", nm, "arguments", ar));
      json_array_append_new(
          blocks, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
                            cid, "name", nm, "input", json_loads(ar, 0, NULL)));
    }
    json_t *am = json_pack("{s:s, s:s}", "role", "assistant", "content", text);
    if (nc > 0)
      json_object_set_new(am, "tool_calls", tcs);
    else
      json_decref(tcs);
    json_array_append_new(*chat, am);
    json_array_append_new(
        *anth, json_pack("{s:s, s:o}", "role", "assistant", "content", blocks));
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      unsigned kind = rnd(4);
      const char *res = kind == 0   ? "Error: file not found"
                        : kind == 1 ? "failed hard"
                                    : "ok";
      json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                             cid, "content", res);
      if (kind == 1)
        json_object_set_new(tm, "is_error", json_true());
      json_array_append_new(*chat, tm);
      json_t *content =
          rnd(2) == 0 ? json_string(res)
                      : json_pack("[{s:s, s:s}]", "type", "text", "text", res);
      json_array_append_new(results, json_pack("{s:s, s:s, s:o, s:b}", "type",
                                               "tool_result", "tool_use_id",
                                               cid, "content", content,
                                               "is_error", kind == 1));
    }
    if (nc > 0)
      json_array_append_new(
          *anth, json_pack("{s:s, s:o}", "role", "user", "content", results));
    else
      json_decref(results);
    id += (int)nc;
  }
}

Test(proxy, anthropic_decisions_equal_the_chat_ones) {
  ag_config cfgs[2];
  cfgs[0] = test_cfg();
  cfgs[1] = test_cfg();
  cfgs[1].loop.nudge_before_stop = true;
  cfgs[1].loop.cycle_limit = 2;
  int stops = 0;
  for (int c = 0; c < 2; c++) {
    cfgs[c].loop.max_iterations = 0;
    cfgs[c].loop.max_tokens_per_turn = 0;
    for (int i = 0; i < 200; i++) {
      json_t *chat = NULL, *anth = NULL;
      random_pair(1 + (int)rnd(12), &chat, &anth);
      json_t *rc = json_pack("{s:s, s:o}", "model", "m", "messages", chat);
      json_t *ra = json_pack("{s:s, s:i, s:o}", "model", "m", "max_tokens", 10,
                             "messages", anth);
      char *bc = json_dumps(rc, JSON_COMPACT),
           *ba = json_dumps(ra, JSON_COMPACT);
      json_decref(rc);
      json_decref(ra);
      ag_verdict vc, va;
      ag_error_t err;
      int ac = ag_proxy_decide(&cfgs[c], bc, strlen(bc), false, &vc, &err);
      cr_assert_geq(ac, 0, "%s", err.msg);
      int aa = ag_proxy_decide(&cfgs[c], ba, strlen(ba), true, &va, &err);
      cr_assert_geq(aa, 0, "%s: %s", err.msg, ba);
      cr_expect_eq(aa, ac, "cfg %d run %d: %d vs %d: %s", c, i, aa, ac, ba);
      if (ac != AG_ALLOW) {
        stops++;
        cr_expect_eq(va.reason, vc.reason, "cfg %d run %d: %s vs %s: %s", c, i,
                     ag_reason_name(va.reason), ag_reason_name(vc.reason), ba);
      }
      free(bc);
      free(ba);
    }
  }
  cr_expect_gt(stops, 30, "the random turns exercise stops (%d)", stops);
}

/* ---- the tape's decision equals the tree's --------------------------------
 */

#define ODD "\xc3\xa9\xf0\x9f\x98\x80\n\"/" /* é, 😀, newline, quote, slash */

/* Escapes in every string the decision reads: arguments get an extra
 * member (the same for every call, so repeats stay repeats), results and
 * texts a suffix; dumped with JSON_ENSURE_ASCII they become \u00e9,
 * \ud83d\ude00, \n, \". */
static void add_escapes(json_t *msgs) {
  size_t i, k;
  json_t *m, *x;
  json_array_foreach(msgs, i, m) {
    json_array_foreach(json_object_get(m, "tool_calls"), k, x) {
      json_t *fn = json_object_get(x, "function");
      json_t *a = json_loads(
          json_string_value(json_object_get(fn, "arguments")), 0, NULL);
      json_object_set_new(a, "s", json_string(ODD));
      char *d = json_dumps(a, JSON_COMPACT);
      json_object_set_new(fn, "arguments", json_string(d));
      free(d);
      json_decref(a);
    }
    json_t *c = json_object_get(m, "content");
    if (json_is_string(c) && json_string_length(c) > 0) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s" ODD, json_string_value(c));
      json_object_set_new(m, "content", json_string(buf));
    }
    json_array_foreach(c, k, x) {
      json_t *in = json_object_get(x, "input");
      if (json_is_object(in))
        json_object_set_new(in, "s", json_string(ODD));
      json_t *t = json_object_get(x, "text");
      json_t *rc = json_object_get(x, "content");
      if (json_is_string(rc)) {
        t = rc;
      } else {
        size_t q;
        json_t *y;
        json_array_foreach(rc, q, y) {
          char buf[256];
          snprintf(buf, sizeof buf, "%s" ODD,
                   json_string_value(json_object_get(y, "text")));
          json_object_set_new(y, "text", json_string(buf));
        }
      }
      if (json_is_string(t)) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s" ODD, json_string_value(t));
        json_string_set(t, buf);
      }
    }
  }
}

/* Chat contents as arrays of parts, which the audit's parser reads (and
 * fast_turn leaves to it): a tool result as a text part and an image part,
 * the text of every second result in two parts, an assistant's text as a
 * text part. The same for the same text, so repeats stay repeats. */
static void to_parts(json_t *msgs) {
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *c = json_object_get(m, "content");
    if (!json_is_string(c) || json_string_length(c) == 0)
      continue;
    if (strcmp(role, "tool") == 0 && i % 2 == 0)
      json_object_set_new(m, "content",
                          json_pack("[{s:s, s:O}, {s:s, s:{s:s}}]", "type",
                                    "text", "text", c, "type", "image_url",
                                    "image_url", "url", "u"));
    else if (strcmp(role, "tool") == 0)
      json_object_set_new(
          m, "content",
          json_pack("[s, {s:s, s:O}]", "Result:", "type", "text", "text", c));
    else if (strcmp(role, "assistant") == 0)
      json_object_set_new(m, "content",
                          json_pack("[{s:s, s:O}]", "type", "text", "text", c));
  }
}

/* The body decided through the tape alone and through the tree alone:
 * the same action, reason, call, tool and message. Returns the action. */
static int expect_same_decision(const ag_config *cfg, const char *body,
                                bool anth, const char *what) {
  ag_verdict vt, vj;
  ag_error_t et, ej;
  size_t len = strlen(body);
  int at =
      ag_proxy_decide_read(cfg, body, len, anth, AG_PROXY_READ_TAPE, &vt, &et);
  int aj =
      ag_proxy_decide_read(cfg, body, len, anth, AG_PROXY_READ_TREE, &vj, &ej);
  cr_assert_geq(aj, 0, "%s: the tree refuses it: %s", what, ej.msg);
  cr_assert_neq(at, -2, "%s: the tape left it to the tree: %s", what, body);
  cr_assert_eq(at, aj, "%s: tape %d, tree %d: %s", what, at, aj, body);
  if (aj != AG_ALLOW) {
    cr_expect_eq(vt.reason, vj.reason, "%s: %s vs %s", what,
                 ag_reason_name(vt.reason), ag_reason_name(vj.reason));
    cr_expect_eq(vt.call_index, vj.call_index, "%s", what);
    cr_expect_str_eq(vt.tool, vj.tool, "%s", what);
    cr_expect_str_eq(vt.message, vj.message, "%s", what);
  }
  return aj;
}

Test(proxy, tape_decisions_equal_the_tree_ones) {
  ag_config cfgs[3];
  cfgs[0] = test_cfg();
  cr_assert_eq(ag_config_preset(&cfgs[1], "default", NULL), AG_OK);
  cfgs[2] = test_cfg();
  cfgs[2].loop.nudge_before_stop = true;
  cfgs[2].loop.cycle_limit = 2;
  int stops = 0;
  char what[64];
  for (int c = 0; c < 3; c++) {
    cfgs[c].loop.max_iterations = 0;
    cfgs[c].loop.max_tokens_per_turn = 0;
    for (int i = 0; i < 150; i++) {
      bool esc = i % 2 == 1; /* escapes, in \u form (ENSURE_ASCII) */
      size_t flags = JSON_COMPACT | (esc ? JSON_ENSURE_ASCII : 0) |
                     (i % 3 == 2 ? JSON_INDENT(1) : 0);
      json_t *msgs = random_turn(1 + (int)rnd(12));
      json_t *chat = NULL, *anth = NULL;
      random_pair(1 + (int)rnd(12), &chat, &anth);
      if (esc) {
        add_escapes(msgs);
        add_escapes(chat);
        add_escapes(anth);
      }
      if (i % 5 >= 3) {
        to_parts(msgs);
        to_parts(chat);
      }
      json_t *r1 = json_pack("{s:s, s:o}", "model", "m", "messages", msgs);
      json_t *r2 = json_pack("{s:s, s:o}", "model", "m", "messages", chat);
      json_t *r3 = json_pack("{s:s, s:i, s:o, s:b}", "model", "m", "max_tokens",
                             10, "messages", anth, "stream", i % 4 == 0);
      char *b1 = json_dumps(r1, flags), *b2 = json_dumps(r2, flags),
           *b3 = json_dumps(r3, flags);
      snprintf(what, sizeof what, "cfg %d run %d chat", c, i);
      stops += expect_same_decision(&cfgs[c], b1, false, what) != AG_ALLOW;
      snprintf(what, sizeof what, "cfg %d run %d pair chat", c, i);
      stops += expect_same_decision(&cfgs[c], b2, false, what) != AG_ALLOW;
      snprintf(what, sizeof what, "cfg %d run %d pair anthropic", c, i);
      stops += expect_same_decision(&cfgs[c], b3, true, what) != AG_ALLOW;
      json_decref(r1);
      json_decref(r2);
      json_decref(r3);
      free(b1);
      free(b2);
      free(b3);
    }
  }
  cr_expect_gt(stops, 100, "the random turns exercise stops (%d)", stops);
}

/* Escapes where the decision compares: in roles, keys and ids. */
Test(proxy, tape_reads_escaped_keys_and_roles) {
  ag_config cfg = test_cfg();
  const char *round =
      "{\"role\":\"assist\\u0061nt\",\"content\":null,\"tool_c\\u0061lls\":"
      "[{\"id\":\"c\\u0031\",\"type\":\"function\",\"function\":{\"name\":"
      "\"re\\u0061d\",\"arguments\":\"{\\\"p\\\":\\\"\\\\u00e9\\\"}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"\\u00631\",\"content\":"
      "\"Error: no \\\"x\\\"\"}";
  char body[2048];
  snprintf(
      body, sizeof body,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"us\\u0065r\",\"content\":"
      "\"go\"},%s,%s,%s]}",
      round, round, round);
  cr_expect_eq(expect_same_decision(&cfg, body, false, "escaped"), AG_STOP);
  const char *anth_round =
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_\\u0075se\","
      "\"id\":\"t\\u0031\",\"name\":\"read\",\"input\":{ \"p\" : "
      "\"\\u00e9\", \"q\": [1, {\"r\": 2.50}] }}]},{\"role\":\"user\","
      "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\","
      "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
      "\"text\":\"b\\n\"}]}]}";
  snprintf(body, sizeof body,
           "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
           "\"content\":\"go\"},%s,%s,%s]}",
           anth_round, anth_round, anth_round);
  cr_expect_eq(expect_same_decision(&cfg, body, true, "escaped anthropic"),
               AG_STOP);
  /* every byte of a compared word escaped: "tool_result", "assistant" */
  const char *full_round =
      "{\"role\":\"\\u0061\\u0073\\u0073\\u0069\\u0073\\u0074\\u0061"
      "\\u006e\\u0074\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\","
      "\"name\":\"read\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{"
      "\"type\":\"\\u0074\\u006f\\u006f\\u006c\\u005f\\u0072\\u0065"
      "\\u0073\\u0075\\u006c\\u0074\",\"tool_use_id\":\"t1\",\"content\":"
      "\"Error: x\",\"is_error\":true}]}";
  snprintf(body, sizeof body,
           "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
           "\"content\":\"go\"},%s,%s,%s]}",
           full_round, full_round, full_round);
  cr_expect_eq(expect_same_decision(&cfg, body, true, "all escaped"), AG_STOP);
}

/* Bodies the tape does not take: each decided by the tree, as before. */
Test(proxy, tape_refusals_fall_back_to_the_tree) {
  ag_config cfg = test_cfg();
  char *stop = conversation(3, "read", "{\"p\":1}", "same");
  cr_assert_not_null(stop);
  /* the stopping conversation with something the tape refuses in front */
  static const char *const extras[] = {
      "\"model\":\"a\",\"model\":\"b\",", /* a duplicate key */
      "\"x\":1e400,",                     /* a number out of a double */
      "\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
      "[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
      "]]]]]]]]],",                         /* deeper than the tape goes */
      "\"x\":123456789012345678901234567,", /* too big for jansson */
      "\"x\":\"a\\u0000b\",",               /* NUL: jansson refuses it */
      "\"x\":\"\xed\xa0\x80\",",            /* a surrogate in UTF-8 */
      "\"x\":\"\xc0\xaf\",",                /* an overlong encoding */
      "\"x\":[1,2,],",                      /* not JSON at all */
  };
  for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++) {
    char body[8192];
    snprintf(body, sizeof body, "{%s%s", extras[i], stop + 1);
    ag_verdict vt, vj, va;
    ag_error_t et, ej, ea;
    size_t len = strlen(body);
    cr_expect_eq(ag_proxy_decide_read(&cfg, body, len, false,
                                      AG_PROXY_READ_TAPE, &vt, &et),
                 -2, "%zu: the tape takes %s", i, body);
    int aj = ag_proxy_decide_read(&cfg, body, len, false, AG_PROXY_READ_TREE,
                                  &vj, &ej);
    int aa = ag_proxy_decide(&cfg, body, len, false, &va, &ea);
    cr_expect_eq(aa, aj, "%zu", i);
    if (aj < 0)
      cr_expect_str_eq(ea.msg, ej.msg, "%zu", i);
    else
      cr_expect_eq(va.reason, vj.reason, "%zu", i);
  }
  free(stop);
  /* malformed: the tree's message */
  ag_verdict v;
  ag_error_t e;
  cr_expect_eq(ag_proxy_decide(&cfg, "{\"messages\":[}", 14, false, &v, &e),
               -1);
  cr_expect_eq(e.code, AG_EJSON);
  cr_expect(strstr(e.msg, "not JSON") != NULL, "%s", e.msg);
}

/* ---- The audit reads every shape the proxy guards ----------------------- */

/* A Messages conversation whose tool results fail four times in a row:
 * `agentguard audit` reports the stop the proxy makes of it (before, the
 * audit read it as five chat turns without calls and reported nothing). */
Test(proxy, audit_reads_a_messages_transcript_as_the_proxy_decides) {
  /* four different calls, each result a different error */
  char *conv =
      messages_conv(4, "{\"path\":\"x\"}", "Error: denied", true, false);
  json_t *req = json_loads(conv, 0, NULL);
  free(conv);
  size_t i;
  json_t *m;
  int k = 0;
  json_array_foreach(json_object_get(req, "messages"), i, m) {
    json_t *b = json_array_get(json_object_get(m, "content"), 1);
    json_t *r0 = json_array_get(json_object_get(m, "content"), 0);
    char text[64];
    snprintf(text, sizeof text, "Error: permission denied: /srv/f%d", k);
    if (json_is_object(b)) {
      json_object_set_new(b, "input", json_pack("{s:i}", "n", k));
    } else if (json_is_object(r0) &&
               json_object_get(r0, "tool_use_id") != NULL) {
      json_object_set_new(r0, "content", json_string(text));
      k++;
    }
  }
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  ag_config c;
  cr_assert_eq(ag_config_preset(&c, "default", NULL), AG_OK);
  ag_verdict v;
  ag_error_t err;
  int act = ag_proxy_decide(&c, body, strlen(body), true, &v, &err);
  cr_expect(act == AG_STOP || act == AG_ESCALATE, "%d: %s", act, body);
  cr_expect_str_eq(ag_reason_name(v.reason), "consecutive_errors");
  char path[] = "/tmp/ag_messages_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, body, strlen(body)), (ssize_t)strlen(body));
  close(fd);
  char cmd[512], out[8192];
  snprintf(cmd, sizeof cmd, "%s/agentguard audit --json %s 2>&1", AG_BINARY_DIR,
           path);
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  pclose(f);
  unlink(path);
  cr_expect(strstr(out, "\"format\":\"messages\"") != NULL, "%s", out);
  char want[64];
  snprintf(want, sizeof want, "\"reason\":\"%s\"", ag_reason_name(v.reason));
  cr_expect(strstr(out, want) != NULL, "the audit says otherwise: %s", out);
  free(body);
}

/* Random turns in Anthropic's shape: the audit of the transcript and the
 * proxy's decision on the same messages agree, stop for stop. */
Test(proxy, messages_decisions_equal_the_audits) {
  ag_config cfgs[2];
  cfgs[0] = test_cfg();
  cfgs[1] = test_cfg();
  cfgs[1].loop.nudge_before_stop = true;
  cfgs[1].loop.cycle_limit = 2;
  int stops = 0;
  for (int c = 0; c < 2; c++) {
    cfgs[c].loop.max_iterations = 0; /* the coming request never trips */
    cfgs[c].loop.max_tokens_per_turn = 0;
    ag_auditor *a = NULL;
    cr_assert_eq(ag_auditor_new(&a, &cfgs[c], NULL, NULL), AG_OK);
    for (int i = 0; i < 200; i++) {
      json_t *chat = NULL, *anth = NULL;
      random_pair(1 + (int)rnd(12), &chat, &anth);
      json_decref(chat);
      json_t *req = json_pack("{s:s, s:i, s:o}", "model", "m", "max_tokens", 10,
                              "messages", anth);
      char *body = json_dumps(req, JSON_COMPACT);
      json_decref(req);
      stops += audit_equals_decision(a, &cfgs[c], body, body, true, c, i);
      free(body);
    }
    ag_auditor_free(a);
  }
  cr_expect_gt(stops, 30, "the random turns exercise stops (%d)", stops);
}

/* A "system" message inside Messages' list (Claude Code sends them) is
 * context: no 400, the body goes upstream as it came, and it does not
 * come between repeated calls. */
Test(proxy, messages_with_system_messages_inside_are_guarded) {
  canned_message_call("{\"path\":\"b\"}");
  char *conv = messages_conv(2, "{\"path\":\"a\"}", "text of a", false, false);
  json_t *req = json_loads(conv, 0, NULL);
  free(conv);
  json_t *msgs = json_object_get(req, "messages");
  json_array_insert_new(
      msgs, 1,
      json_pack("{s:s, s:s}", "role", "system", "content",
                "<system-reminder>be brief</system-reminder>"));
  json_array_append_new(msgs, json_pack("{s:s, s:[{s:s, s:s}]}", "role",
                                        "system", "content", "type", "text",
                                        "text", "reminder"));
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 1, "forwarded");
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].body, body, "the body goes as it came");
  pthread_mutex_unlock(&U.mu);
  free(r);
  free(body);
}

/* What Claude Code sends: system messages inside the list, thinking and
 * redacted_thinking blocks, server tools and their results, images and
 * tool references in tool results, cache_control everywhere. None of it
 * is a 400, and the same call three times in a row is still the same call
 * three times (identical_call_limit 3): stopped before it goes upstream. */
Test(proxy, messages_of_claude_code_are_read_and_guarded) {
  json_t *msgs =
      json_pack("[{s:s, s:[{s:s, s:s, s:{s:s}}]}, {s:s, s:s}]", "role", "user",
                "content", "type", "text", "text", "Fix the bug.",
                "cache_control", "type", "ephemeral", "role", "system",
                "content", "<system-reminder>Use the tools.</system-reminder>");
  for (int i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof id, "toolu_%d", i);
    json_array_append_new(
        msgs,
        json_pack("{s:s, s:[{s:s, s:s, s:s}, {s:s, s:s}, {s:s, s:s, s:s, "
                  "s:{s:s}}, {s:s, s:s, s:o}, {s:s, s:s, s:s, s:{}, "
                  "s:{s:s}}]}",
                  "role", "assistant", "content", "type", "thinking",
                  "thinking", "Let me look.", "signature", "sig==", "type",
                  "redacted_thinking", "data", "EuYBCk==", "type",
                  "server_tool_use", "id", "srvtoolu_1", "name", "web_search",
                  "input", "query", "bug", "type", "web_search_tool_result",
                  "tool_use_id", "srvtoolu_1", "content", json_array(), "type",
                  "tool_use", "id", id, "name", "read", "input",
                  "cache_control", "type", "ephemeral"));
    json_array_append_new(
        msgs,
        json_pack("{s:s, s:[{s:s, s:s, s:[{s:s, s:s}, {s:s, s:{s:s, s:s, "
                  "s:s}}, {s:s, s:s}]}]}",
                  "role", "user", "content", "type", "tool_result",
                  "tool_use_id", id, "content", "type", "text", "text",
                  "file text", "type", "image", "source", "type", "base64",
                  "media_type", "image/png", "data", "iVBORw0KGgo=", "type",
                  "tool_reference", "tool_name", "read"));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system",
                                          "content", "<reminder/>"));
  }
  json_t *req = json_pack("{s:s, s:i, s:o, s:b, s:[{s:s, s:{s:s}}]}", "model",
                          "claude-opus-4-5", "max_tokens", 1024, "messages",
                          msgs, "stream", false, "tools", "name", "read",
                          "input_schema", "type", "object");
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  resp *r = call(P, "POST", "/v1/messages?beta=true", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_expect_eq(n_upstream(), 0, "stopped before going upstream");
  free(r);
  free(body);
}

/* A 400 the proxy answers itself leaves an event saying why. */
