/*
 * tests/oom/failmalloc.h - the fault-injecting allocator of the
 * out-of-memory driver (tests/oom/oom.c).
 *
 * The driver is linked with -Wl,--wrap=malloc,calloc,realloc,free,strdup,
 * strndup: every allocation the library's own objects make goes through
 * the wrappers in failmalloc.c, which count it and, when armed, make the
 * Nth one fail. jansson's and OpenSSL's allocator hooks go the same way.
 * The wrappers forward to the real allocator (__real_malloc: glibc's, or
 * AddressSanitizer's in a sanitizer build, which keeps checking).
 *
 * While tracking, every live pointer handed out is kept in a table, so a
 * run can tell how many of its allocations were never freed (a leak) with
 * no help from LeakSanitizer; in an ASan build LeakSanitizer checks again
 * at exit.
 */
#ifndef AG_TEST_FAILMALLOC_H
#define AG_TEST_FAILMALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* Where the failed allocation came from. */
typedef enum {
  FM_FROM_LIBC = 0, /* malloc and friends called by the library */
  FM_FROM_JANSSON,  /* json_set_alloc_funcs */
  FM_FROM_OPENSSL   /* CRYPTO_set_mem_functions */
} fm_source;

/* Installs the jansson and OpenSSL hooks. Call first in main, before any
 * allocation through either library. Returns false when OpenSSL refused
 * (it had allocated already). */
bool fm_install(void);

/* Starts a run: forgets the tracked pointers, zeroes the counter, and arms
 * failure of allocation number `fail_at` (1-based; 0: none fails), and
 * with `persistent` of every one after it too (memory that stays short, as
 * SQLite's "persistent" mode). Every allocation from now on is counted and
 * tracked, on every thread. */
void fm_begin(long fail_at, bool persistent);

/* Ends a run: no more counting, tracking or failing. */
void fm_end(void);

/* Allocations counted since fm_begin. */
long fm_count(void);

/* Whether the armed failure happened, and where it came from. */
bool fm_failed(fm_source *from);

/* Pointers handed out since fm_begin and not freed yet (a leak once the
 * run has freed everything it made), and the size of the first one. */
long fm_live(size_t *first_size);

#endif /* AG_TEST_FAILMALLOC_H */
