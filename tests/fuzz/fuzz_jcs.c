/*
 * tests/fuzz/fuzz_jcs.c - libFuzzer target for the RFC 8785 canonicalizer
 * (src/core/jcs.c). Built by CMake with clang (AG_FUZZ); scripts/fuzz.sh
 * builds and runs it with tests/fuzz/corpus/jcs/ and tests/fuzz/jcs.dict.
 * (`sh scripts/fuzz.sh jcs` runs this target alone.)
 *
 * Properties checked on every input:
 *  - ag_canonicalize either succeeds or fails with one of the documented
 *    codes and a byte position inside the input;
 *  - on success the output is a fixed point (canonicalizing it again gives
 *    the same bytes) and contains no whitespace outside strings;
 *  - a reused ag__jcs (as a guard holds it) agrees with the one-shot
 *    functions, and the signature equals SHA-256("f:" + canonical form).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "core/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ag__jcs *reused;

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_jcs: property failed: %s\n", what);
    abort();
  }
}

typedef struct buf {
  char *p;
  size_t len, cap;
} buf;

static int buf_sink(void *user, const char *d, size_t n) {
  buf *b = user;
  if (b->len + n > b->cap) {
    size_t cap = (b->len + n) * 2;
    char *p = realloc(b->p, cap);
    if (p == NULL)
      return 1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (reused == NULL &&
      ag__jcs_new(&reused, 1 << 20, 1 << 20, 256, NULL) != AG_OK)
    abort();
  const char *json = (const char *)data;
  char *out = NULL;
  size_t out_len = 0;
  ag_error_t err;
  ag_err_t rc = ag_canonicalize(json, size, &out, &out_len, &err);

  uint8_t sig1[AG_SIG_LEN], sig2[AG_SIG_LEN];
  ag_error_t err2;
  ag_err_t rc2 = ag__jcs_signature(reused, "f", 1, json, size, sig1, &err2);
  check(rc == rc2, "reused scratch and ag_canonicalize agree on the code");

  if (rc != AG_OK) {
    check(rc == AG_EJSON || rc == AG_EDUPKEY || rc == AG_EUTF8 ||
              rc == AG_ENUMBER || rc == AG_EDEPTH || rc == AG_ETOOBIG,
          "documented error code");
    check(err.code == rc && err.pos >= 0 && (size_t)err.pos <= size,
          "error position inside the input");
    check(err2.pos == err.pos, "same error position");
    check(out == NULL, "no output on error");
    return 0;
  }

  /* Fixed point. */
  char *again = NULL;
  size_t again_len = 0;
  check(ag_canonicalize(out, out_len, &again, &again_len, NULL) == AG_OK,
        "canonical output is valid");
  check(again_len == out_len && memcmp(again, out, out_len) == 0,
        "canonical output is a fixed point");
  ag_free(again);

  /* No insignificant whitespace. */
  int in_str = 0;
  for (size_t i = 0; i < out_len; i++) {
    char c = out[i];
    if (in_str) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_str = 0;
    } else if (c == '"') {
      in_str = 1;
    } else {
      check(c != ' ' && c != '\n' && c != '\r' && c != '\t',
            "no whitespace outside strings");
    }
  }

  /* Streaming through the reused scratch gives the same bytes. */
  buf b = {NULL, 0, 0};
  check(ag__jcs_write(reused, json, size, buf_sink, &b, NULL) == AG_OK,
        "ag__jcs_write succeeds");
  check(b.len == out_len && (out_len == 0 || memcmp(b.p, out, out_len) == 0),
        "ag__jcs_write gives the same bytes");
  free(b.p);

  /* Signature framing. */
  check(ag_signature("f", json, size, sig2, NULL) == AG_OK, "ag_signature");
  check(memcmp(sig1, sig2, AG_SIG_LEN) == 0, "signatures agree");
  uint8_t want[32];
  unsigned int n = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  check(ctx != NULL && EVP_DigestInit_ex2(ctx, EVP_sha256(), NULL) == 1 &&
            EVP_DigestUpdate(ctx, "f:", 2) == 1 &&
            EVP_DigestUpdate(ctx, out, out_len) == 1 &&
            EVP_DigestFinal_ex(ctx, want, &n) == 1,
        "EVP");
  EVP_MD_CTX_free(ctx);
  check(memcmp(sig1, want, 32) == 0, "signature is SHA-256(\"f:\" + JCS)");
  ag_free(out);
  return 0;
}
