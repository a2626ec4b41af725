/*
 * src/core/suggest.c - the edit distance behind every "did you mean" of the
 * library (config keys and presets, schema properties, tool names). Each
 * caller keeps its own rule for which candidate to offer; the distance is
 * one function so they all agree on what "close" means.
 */
#include <string.h>

#include "internal.h"

static int lower(int c) {
  return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}

int ag__edit_distance(const char *a, size_t la, const char *b, size_t lb) {
  if (la > AG__SUGGEST_MAX || lb > AG__SUGGEST_MAX)
    return -1;
  int rows[3][AG__SUGGEST_MAX + 1];
  int *pp = rows[0], *p = rows[1], *d = rows[2];
  for (size_t j = 0; j <= lb; j++)
    p[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    d[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int ca = lower((unsigned char)a[i - 1]);
      int cb = lower((unsigned char)b[j - 1]);
      int v = p[j] + 1;
      if (d[j - 1] + 1 < v)
        v = d[j - 1] + 1;
      if (p[j - 1] + (ca != cb) < v)
        v = p[j - 1] + (ca != cb);
      if (i > 1 && j > 1 && ca == lower((unsigned char)b[j - 2]) &&
          lower((unsigned char)a[i - 2]) == cb && pp[j - 2] + 1 < v)
        v = pp[j - 2] + 1;
      d[j] = v;
    }
    int *t = pp;
    pp = p;
    p = d;
    d = t;
  }
  return p[lb];
}

int ag__suggest_limit(size_t input_len) {
  return input_len < 6 ? 1 : 2;
}

AG_EXTERN const char *ag_suggest(const char *word,
                                 const char *const *candidates) {
  if (word == NULL || candidates == NULL)
    return NULL;
  size_t lw = strlen(word);
  int limit = ag__suggest_limit(lw), best_d = limit + 1;
  const char *best = NULL;
  for (size_t i = 0; candidates[i] != NULL; i++) {
    int d = ag__edit_distance(word, lw, candidates[i], strlen(candidates[i]));
    if (d >= 0 && d < best_d) {
      best = candidates[i];
      best_d = d;
    }
  }
  return best;
}
