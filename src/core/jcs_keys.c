/*
 * src/core/jcs_keys.c - the order of an object's keys for the JCS
 * canonicalizer (jcs_impl.h): UTF-16 code unit order, equal neighbours
 * being duplicates. Keys already in order are not sorted (jcs.c checks);
 * otherwise insertion sort for short lists, bottom-up merge sort with the
 * scratch's buffer for long ones (qsort may allocate).
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
