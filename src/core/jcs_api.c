/*
 * src/core/jcs_api.c - the canonicalizer's public one-shot functions
 * (ag_signature, ag_canonicalize, ag_sig_hex; include/agentguard/core.h):
 * each makes a scratch sized to its input (jcs.c), signs or writes through
 * it (jcs_emit.c) and frees it, so they are safe from any thread.
 */
#include "jcs_impl.h"

/* ------------------------------------------------------------------------ */
/* Public convenience functions                                             */
/* ------------------------------------------------------------------------ */

/* Limits of the scratch sized for one input: a token takes at least one
 * byte, so the token cap is never what stops it (invalid text such as
 * "[[[[" gets AG_EJSON, as with a guard's larger scratch). Pages that are
 * not touched are not committed. */
#define CONV_DEPTH 256

static ag_err_t conv_create(ag__jcs **j, size_t len, bool digest,
                            ag_error_t *err) {
  if (len > UINT32_MAX - 2)
    return ag__set_error(err, AG_ETOOBIG, (long)(UINT32_MAX - 2),
                         "arguments: %zu bytes exceed the limit of %lu", len,
                         (unsigned long)(UINT32_MAX - 2));
  return ag__jcs_create(j, len, len + 1, CONV_DEPTH, digest, err);
}

AG_EXTERN ag_err_t ag_signature(const char *name, const char *args,
                                size_t args_len, uint8_t sig[AG_SIG_LEN],
                                ag_error_t *err) {
  if (name == NULL || sig == NULL || (args == NULL && args_len > 0))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_signature: name, args or sig is NULL");
  ag__jcs *j;
  ag_err_t rc = conv_create(&j, args_len, true, err);
  if (rc != AG_OK)
    return rc;
  rc = ag__jcs_signature(j, name, strlen(name), args, args_len, sig, err);
  ag__jcs_free(j);
  return rc;
}

/* The canonical text goes into an ag__buf; a full or failed buffer stops
 * the writer (AG_ENOSPACE, reported as out of memory). */
static int buf_sink(void *user, const char *data, size_t len) {
  return ag__buf_add(user, data, len) == AG_OK ? 0 : 1;
}

AG_EXTERN ag_err_t ag_canonicalize(const char *json, size_t len, char **out,
                                   size_t *out_len, ag_error_t *err) {
  if (out == NULL || (json == NULL && len > 0))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_canonicalize: json or out is NULL");
  *out = NULL;
  if (out_len != NULL)
    *out_len = 0;
  ag__jcs *j;
  ag_err_t rc = conv_create(&j, len, false, err);
  if (rc != AG_OK)
    return rc;
  /* Canonical text is rarely longer than the input; the sink grows it. */
  ag__buf b;
  ag__buf_init(&b, SIZE_MAX / 2); /* the input's own cap bounds it */
  if (ag__buf_reserve(&b, len < SIZE_MAX / 2 - 64 ? len + 64 : len) != AG_OK) {
    ag__jcs_free(j);
    return ag__set_error(err, AG_ENOMEM, -1, "ag_canonicalize: out of memory");
  }
  rc = ag__jcs_write(j, json, len, buf_sink, &b, err);
  ag__jcs_free(j);
  if (rc == AG_ENOSPACE)
    rc = ag__set_error(err, AG_ENOMEM, -1, "ag_canonicalize: out of memory");
  if (rc != AG_OK) {
    ag__buf_free(&b);
    return rc;
  }
  b.p[b.len] = '\0';
  *out = b.p;
  if (out_len != NULL)
    *out_len = b.len;
  return AG_OK;
}

AG_EXTERN void ag_sig_hex(const uint8_t sig[AG_SIG_LEN], char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < AG_SIG_LEN; i++) {
    hex[2 * i] = digits[sig[i] >> 4];
    hex[2 * i + 1] = digits[sig[i] & 15];
  }
  hex[64] = '\0';
}

/* ------------------------------------------------------------------------ */
