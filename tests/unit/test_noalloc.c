/*
 * tests/unit/test_noalloc.c - the guard's check path never allocates after
 * ag_guard_new (DESIGN.md, core.h): begin_iteration, check_calls (with the
 * signature) and record_results, on successes and on errors.
 *
 * Allocations are counted on this thread only while "armed". Plain builds
 * interpose malloc and friends (forwarding to glibc); under AddressSanitizer,
 * whose allocator must not be bypassed, its malloc hook counts instead.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "agentguard.h"

#if defined(__SANITIZE_ADDRESS__)
#define AG_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AG_TEST_ASAN 1
#endif
#endif

static _Thread_local int armed;
static _Thread_local long allocations;

#ifdef AG_TEST_ASAN
/* From the sanitizer runtime (gcc ships it without the header). */
int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void *, size_t),
    void (*free_hook)(const volatile void *));
static void on_malloc(const volatile void *p, size_t n) {
  (void)p;
  (void)n;
  if (armed)
    allocations++;
}
static void on_free(const volatile void *p) {
  (void)p;
}
static void install(void) {
  __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
void *malloc(size_t n);
void *calloc(size_t a, size_t b);
void *realloc(void *p, size_t n);
void *malloc(size_t n) {
  if (armed)
    allocations++;
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  if (armed)
    allocations++;
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  if (armed)
    allocations++;
  return __libc_realloc(p, n);
}
static void install(void) {}
#endif

static void run_calls(ag_guard *g, int n, bool errors) {
  char args[128];
  ag_verdict v;
  ag_call_check ck[2];
  for (int i = 0; i < n; i++) {
    snprintf(
        args, sizeof(args),
        "{\"path\":\"src/f%d.c\",\"line\":%d,\"x\":1.5e3,\"s\":\"\\u00e9\"}",
        i % 50, i);
    ag_call calls[2] = {{"read_file", args, strlen(args)},
                        {"search", "{\"q\":\"a b\",\"n\":[1,2]}", 21}};
    if (ag_guard_begin_iteration(g, 0, &v) != AG_ALLOW)
      ag_guard_begin_turn(g, 0);
    if (ag_guard_check_calls(g, calls, 2, 0, ck, &v) != AG_ALLOW) {
      ag_guard_begin_turn(g, 0);
      continue;
    }
    ag_result res[2] = {
        {"read_file", ck[0].sig, errors ? AG_OUTCOME_ERROR : AG_OUTCOME_OK,
         "Error: No such file or directory", 32, AG_CAT__COUNT},
        {"search", ck[1].sig, AG_OUTCOME_OK, "3 matches", 9, AG_CAT__COUNT}};
    if (ag_guard_record_results(g, res, 2, 0, &v) != AG_ALLOW)
      ag_guard_begin_turn(g, 0);
  }
}

static void check_preset(const char *preset, bool errors) {
  install();
  ag_config cfg;
  cr_assert_eq(ag_config_preset(&cfg, preset, NULL), AG_OK);
  cfg.loop.identical_call_scope = AG_SCOPE_CALL_AND_RESULT;
  ag_guard *g = NULL;
  cr_assert_eq(ag_guard_new(&g, &cfg, NULL, NULL), AG_OK);
  ag_guard_begin_turn(g, 0);
  run_calls(g, 50, errors); /* warm: lazy one-time initialisation */
  armed = 1;
  run_calls(g, 2000, errors);
  armed = 0;
  cr_assert_eq(allocations, 0,
               "%ld allocations on the check path (preset %s, errors %d)",
               allocations, preset, errors);
  ag_guard_free(g);
}

Test(noalloc, default_preset_successes) {
  check_preset("default", false);
}
Test(noalloc, default_preset_errors) {
  check_preset("default", true);
}
Test(noalloc, monadic_and_twelve_factor_errors) {
  check_preset("monadic", true);
  allocations = 0;
  check_preset("twelve-factor", true);
}
