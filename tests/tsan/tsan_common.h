/*
 * tests/tsan/tsan_common.h - the few helpers the ThreadSanitizer drivers
 * share. Not a test framework: a driver is a straight-line main() that stops
 * at the first failed CHECK.
 *
 * CHECK prints "file:line: check failed: <cond>: <message>" and ends the
 * process with status 1 through _exit, from whichever thread failed:
 * exit() would run atexit handlers while other threads still use the
 * library, which TSan could then report as a race of its own.
 */
#ifndef AG_TSAN_COMMON_H
#define AG_TSAN_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* CHECK(cond, fmt, ...): the message should name both sides. */
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      fflush(stderr);                                                          \
      _exit(1);                                                                \
    }                                                                          \
  } while (0)

/* Milliseconds on CLOCK_MONOTONIC, read independently of the library. */
static inline long long tsan_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleeps `us` microseconds, resuming after signal handlers. */
static inline void tsan_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static inline void tsan_sleep_ms(long ms) {
  tsan_sleep_us(ms * 1000);
}

/* Open descriptors of this process (for "no fd leaked" checks). */
static inline int tsan_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  CHECK(d != NULL, "opendir /proc/self/fd: errno %d", errno);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.')
      n++;
  }
  closedir(d);
  return n - 1; /* the directory stream's own descriptor */
}

#endif /* AG_TSAN_COMMON_H */
