/*
 * src/core/jcs_keys.c - the order of an object's keys for the JCS
 * canonicalizer (jcs_impl.h): UTF-16 code unit order, equal neighbours
 * being duplicates. Keys already in order are not sorted (jcs.c checks);
 * otherwise, for a short list whose keys differ in their first 8 bytes,
 * each key's place is counted; else insertion sort for short lists,
 * bottom-up merge sort with the scratch's buffer for long ones (qsort may
 * allocate).
 */
#include "jcs_impl.h"

static void insertion_sort(const ag__jcs *j, kent *v, size_t n) {
  for (size_t i = 1; i < n; i++) {
    kent x = v[i];
    size_t k = i;
    while (k > 0 && kent_cmp(j, &v[k - 1], &x) > 0) {
      v[k] = v[k - 1];
      k--;
    }
    v[k] = x;
  }
}

#define RUN 16

/* Stable: equal keys stay in source order, so the later one is the dup. */
void ag__jcs_sort_keys(const ag__jcs *j, kent *v, size_t n) {
  if (n <= RUN) {
    insertion_sort(j, v, n);
    return;
  }
  for (size_t i = 0; i < n; i += RUN)
    insertion_sort(j, v + i, n - i < RUN ? n - i : RUN);
  kent *from = v, *to = j->aux;
  for (size_t width = RUN; width < n; width *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * width) {
      size_t mid = lo + width < n ? lo + width : n;
      size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
      size_t a = lo, b = mid, o = lo;
      while (a < mid && b < hi)
        to[o++] = kent_cmp(j, &from[b], &from[a]) < 0 ? from[b++] : from[a++];
      while (a < mid)
        to[o++] = from[a++];
      while (b < hi)
        to[o++] = from[b++];
    }
    kent *t = from;
    from = to;
    to = t;
  }
  if (from != v)
    memcpy(v, from, n * sizeof(*v));
}

/* Up to this many keys are placed by counting (n * n comparisons). */
#define RANK_MAX 16

/*
 * A key's place is the number of keys whose prefix is smaller. Every
 * comparison is made, none branches: the keys of an object written in a
 * schema's order are out of order in no pattern a branch predictor learns,
 * and insertion sort's mispredicted loop exits cost more than the n * n
 * comparisons up to RANK_MAX (bench_jcs, "rows"). Distinct prefixes are
 * needed for the prefixes alone to decide, and mean no duplicates: then,
 * and only then, the places are n different ones.
 */
bool ag__jcs_rank_keys(const kent *v, size_t n, uint32_t *o) {
  uint32_t rank[RANK_MAX], seen = 0;
  if (n > RANK_MAX)
    return false;
  for (size_t i = 0; i < n; i++) {
    uint32_t r = 0;
    for (size_t k = 0; k < n; k++)
      r += v[k].prefix < v[i].prefix;
    rank[i] = r;
    seen |= 1u << r;
  }
  if (seen != (1u << n) - 1)
    return false;
  for (size_t i = 0; i < n; i++)
    o[rank[i]] = v[i].tok;
  return true;
}
