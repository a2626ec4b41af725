/*
 * src/base/clock.c - the monotonic clock every deadline uses (ag_now_ms).
 * The core takes time as an argument and never reads a clock itself.
 */
#include <time.h>

#include "internal.h"

AG_EXTERN int64_t ag_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}
