/*
 * tests/fuzz/fuzz_proxy.c - libFuzzer target for the proxy's decision
 * before forwarding (ag_proxy_decide_read, src/proxy/decide.c): a request
 * body read through the JCS tokenizer's tape (src/core/jcs.c) and through
 * the jansson tree, both replayed through a fresh guard.
 *
 * Input: the first byte chooses the API shape (bit 0: Anthropic Messages,
 * else Chat Completions) and the preset (bits 1-2: default, forge, hpd,
 * twelve-factor); the rest is the body.
 *
 * Properties checked on every input:
 *  - the tree reading returns an action, or -1 with one of its documented
 *    codes and a message;
 *  - when the tape decides (it returns -2 where it leaves the body to the
 *    tree), the tree decides the same: the same action, and for a stop
 *    the same reason, call, tool and message; a body the tree refuses
 *    (the client's 400) is never decided by the tape;
 *  - ag_proxy_decide (the served path) gives the tape's answer when the
 *    tape decides, else the tree's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "agentguard/proxy.h"
#include "proxy/hooks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const presets[4] = {"default", "forge", "hpd",
                                       "twelve-factor"};
static ag_config cfgs[4];
static int ready;

static void check(int ok, const char *what, const char *detail) {
  if (!ok) {
    fprintf(stderr, "fuzz_proxy: property failed: %s%s%s\n", what,
            detail != NULL ? ": " : "", detail != NULL ? detail : "");
    abort();
  }
}

static int same_verdict(int a, const ag_verdict *va, int b,
                        const ag_verdict *vb) {
  if (a != b)
    return 0;
  if (a == AG_ALLOW || a < 0)
    return 1;
  return va->reason == vb->reason && va->call_index == vb->call_index &&
         strcmp(va->tool, vb->tool) == 0 &&
         strcmp(va->message, vb->message) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) {
    for (int i = 0; i < 4; i++)
      if (ag_config_preset(&cfgs[i], presets[i], NULL) != AG_OK)
        abort();
    ready = 1;
  }
  if (size < 1)
    return 0;
  bool anthropic = (data[0] & 1) != 0;
  const ag_config *cfg = &cfgs[(data[0] >> 1) & 3];
  const char *body = (const char *)data + 1;
  size_t len = size - 1;

  ag_verdict vt, vp, va;
  ag_error_t et, ep, ea;
  memset(&vt, 0, sizeof(vt));
  memset(&vp, 0, sizeof(vp));
  memset(&va, 0, sizeof(va));
  int tree = ag_proxy_decide_read(cfg, body, len, anthropic, AG_PROXY_READ_TREE,
                                  &vt, &et);
  if (tree < 0) {
    check(tree == -1, "the tree reading returns an action or -1", NULL);
    check(et.code == AG_EJSON || et.code == AG_EINVAL || et.code == AG_ENOMEM,
          "a documented error code", et.msg);
    check(et.msg[0] != '\0', "a message says why", NULL);
  }
  int tape = ag_proxy_decide_read(cfg, body, len, anthropic, AG_PROXY_READ_TAPE,
                                  &vp, &ep);
  if (tape != -2) {
    check(tree >= 0, "the tape never decides a body the tree refuses", et.msg);
    check(same_verdict(tape, &vp, tree, &vt),
          "the tape decides as the tree does", vp.message);
  }
  int any = ag_proxy_decide(cfg, body, len, anthropic, &va, &ea);
  check(
      same_verdict(any, &va, tape != -2 ? tape : tree, tape != -2 ? &vp : &vt),
      "the served path gives the tape's answer, else the tree's", va.message);
  if (any < 0)
    check(ea.code == et.code && strcmp(ea.msg, et.msg) == 0,
          "the served path refuses with the tree's message", ea.msg);
  return 0;
}
