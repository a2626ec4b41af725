/*
 * src/core/sha256.c - the one SHA-256 context the core hashes through
 * (signatures, error keys, result digests), allocation-free after
 * ag__sha256_new.
 *
 * Why not EVP: on OpenSSL 3.0 every EVP digest (re)initialisation frees and
 * re-creates the provider's context - measured: one malloc per hash for
 * EVP_DigestInit_ex2, EVP_DigestInit_ex(ctx, NULL, NULL), with or without
 * EVP_MD_CTX_FLAG_REUSE, and for EVP_MD_CTX_copy_ex; the one-shot SHA256()
 * makes three. The core promises no allocation on the check path, so it
 * uses OpenSSL's SHA256_Init/Update/Final, which keep their state in the
 * caller's struct (deprecated since 3.0 but present in every 3.x; also ~15%
 * faster for short inputs). Where OpenSSL is built without deprecated APIs
 * the EVP path below is compiled instead: correct, one malloc per hash.
 */
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init & co., see above */

#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdlib.h>

#include "internal.h"

#if defined(OPENSSL_NO_DEPRECATED_3_0)
#define AG__SHA_EVP 1
#endif

struct ag__sha256 {
#ifdef AG__SHA_EVP
  EVP_MD *md;
  EVP_MD_CTX *ctx;
#else
  SHA256_CTX c;
#endif
  bool failed;
};

ag_err_t ag__sha256_new(ag__sha256 **out) {
  ag__sha256 *s = calloc(1, sizeof(*s));
  *out = NULL;
  if (s == NULL)
    return AG_ENOMEM;
#ifdef AG__SHA_EVP
  s->md = EVP_MD_fetch(NULL, "SHA256", NULL);
  s->ctx = EVP_MD_CTX_new();
  if (s->md == NULL || s->ctx == NULL) {
    ag__sha256_free(s);
    return AG_ECRYPTO;
  }
#endif
  *out = s;
  return AG_OK;
}

void ag__sha256_free(ag__sha256 *s) {
  if (s == NULL)
    return;
#ifdef AG__SHA_EVP
  EVP_MD_CTX_free(s->ctx);
  EVP_MD_free(s->md);
#endif
  free(s);
}

void ag__sha256_init(ag__sha256 *s) {
#ifdef AG__SHA_EVP
  s->failed = EVP_DigestInit_ex2(s->ctx, s->md, NULL) != 1;
#else
  s->failed = SHA256_Init(&s->c) != 1;
#endif
}

void ag__sha256_update(ag__sha256 *s, const void *data, size_t len) {
  if (s->failed || len == 0)
    return;
#ifdef AG__SHA_EVP
  s->failed = EVP_DigestUpdate(s->ctx, data, len) != 1;
#else
  s->failed = SHA256_Update(&s->c, data, len) != 1;
#endif
}

bool ag__sha256_final(ag__sha256 *s, uint8_t out[AG_SIG_LEN]) {
  if (s->failed)
    return false;
#ifdef AG__SHA_EVP
  unsigned int n = 0;
  return EVP_DigestFinal_ex(s->ctx, out, &n) == 1 && n == AG_SIG_LEN;
#else
  return SHA256_Final(out, &s->c) == 1;
#endif
}
