/*
 * tests/oom/failmalloc.c - counting, failing, tracking allocator wrappers
 * (failmalloc.h says how they are wired in).
 *
 * Why -Wl,--wrap and not an interposed malloc: AddressSanitizer interposes
 * malloc itself; a second definition in the program would bypass it (or
 * clash with it). --wrap rewrites only the references in the objects linked
 * into the driver (the static library and the driver), so the sanitizer's
 * allocator stays underneath and shared libraries (libc, pcre2, curl) keep
 * theirs. jansson and OpenSSL take hooks instead.
 *
 * The live-pointer table is open addressing with linear probing; a slot is
 * empty unless its generation is the current run's, so fm_begin forgets
 * every pointer by bumping the generation (no clearing). A freed slot keeps
 * the generation with a NULL pointer (a tombstone). One mutex guards the
 * table and the counter: tools run on the scheduler's pool threads.
 */
#include "failmalloc.h"

#include <execinfo.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
json_t *__real_json_loadb(const char *b, size_t n, size_t f, json_error_t *e);
json_t *__real_json_loads(const char *s, size_t f, json_error_t *e);
json_t *__wrap_json_loadb(const char *b, size_t n, size_t f, json_error_t *e);
json_t *__wrap_json_loads(const char *s, size_t f, json_error_t *e);
char *__real_json_dumps(const json_t *j, size_t f);
char *__wrap_json_dumps(const json_t *j, size_t f);

#define TABLE_BITS 18
#define TABLE_SIZE ((size_t)1 << TABLE_BITS)

typedef struct slot {
  void *p;
  size_t size;
  unsigned gen;
} slot;

static slot table[TABLE_SIZE];
static unsigned gen = 1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool tracking;
static long counter;
static long fail_at;
static bool fail_after; /* every allocation from fail_at on fails */
static bool failed;
static fm_source failed_from;
static long live;
static bool show_stack;
/* Inside json_loadb / json_loads on this thread, and jansson allocations
 * seen so far there (see __wrap_json_loadb). */
static _Thread_local int in_json_load;
static _Thread_local long load_allocs;
/* Inside json_dumps on this thread: jansson allocations seen so far. */
static _Thread_local int in_json_dumps;
static _Thread_local long dumps_allocs;

static size_t hash_ptr(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)(x & (TABLE_SIZE - 1));
}

/* Under mu. */
static void track(void *p, size_t size) {
  size_t i = hash_ptr(p);
  for (size_t k = 0; k < TABLE_SIZE; k++, i = (i + 1) & (TABLE_SIZE - 1)) {
    if (table[i].gen != gen || table[i].p == NULL) {
      table[i].p = p;
      table[i].size = size;
      table[i].gen = gen;
      live++;
      return;
    }
  }
  fprintf(stderr, "failmalloc: the live-pointer table is full\n");
  abort();
}

/* Under mu. Returns whether p was tracked (and forgets it). */
static bool untrack(void *p) {
  size_t i = hash_ptr(p);
  for (size_t k = 0; k < TABLE_SIZE; k++, i = (i + 1) & (TABLE_SIZE - 1)) {
    if (table[i].gen != gen)
      return false;
    if (table[i].p == p) {
      table[i].p = NULL;
      live--;
      return true;
    }
  }
  return false;
}

/* Counts one allocation; returns true when it must fail. Under mu. */
static bool should_fail(fm_source from) {
  if (!tracking)
    return false;
  counter++;
  if (counter == fail_at || (fail_after && fail_at > 0 && counter > fail_at)) {
    if (failed)
      return true;
    failed = true;
    failed_from = from;
    if (show_stack) { /* OOM_BACKTRACE: where the failure was injected */
      void *frames[32];
      int n = backtrace(frames, 32);
      fprintf(stderr, "failmalloc: allocation %ld fails here:\n", counter);
      backtrace_symbols_fd(frames, n, 2);
    }
    return true;
  }
  return false;
}

static void *alloc_from(size_t n, fm_source from) {
  pthread_mutex_lock(&mu);
  bool spared =
      from == FM_FROM_JANSSON && ((in_json_load && load_allocs++ > 0) ||
                                  (in_json_dumps && dumps_allocs++ > 0));
  bool fail = !spared && should_fail(from);
  pthread_mutex_unlock(&mu);
  if (fail)
    return NULL;
  void *p = __real_malloc(n);
  if (p != NULL) {
    pthread_mutex_lock(&mu);
    if (tracking)
      track(p, n);
    pthread_mutex_unlock(&mu);
  }
  return p;
}

static void free_from(void *p) {
  if (p == NULL)
    return;
  pthread_mutex_lock(&mu);
  if (tracking)
    untrack(p);
  pthread_mutex_unlock(&mu);
  __real_free(p);
}

static void *realloc_from(void *p, size_t n, fm_source from) {
  if (p == NULL)
    return alloc_from(n, from);
  if (n == 0) { /* glibc frees here */
    free_from(p);
    return NULL;
  }
  pthread_mutex_lock(&mu);
  bool fail = should_fail(from);
  pthread_mutex_unlock(&mu);
  if (fail)
    return NULL;
  /* Forget p first: once realloc has freed it, another thread may get the
   * same address. Put the new block back only when p was ours (a block
   * allocated before the run is not the run's to free). */
  pthread_mutex_lock(&mu);
  bool ours = tracking && untrack(p);
  pthread_mutex_unlock(&mu);
  void *q = __real_realloc(p, n);
  pthread_mutex_lock(&mu);
  if (ours && tracking)
    track(q != NULL ? q : p, q != NULL ? n : 0);
  pthread_mutex_unlock(&mu);
  return q;
}

void *__wrap_malloc(size_t n) {
  return alloc_from(n, FM_FROM_LIBC);
}

void *__wrap_calloc(size_t a, size_t b) {
  if (b != 0 && a > SIZE_MAX / b)
    return NULL;
  void *p = alloc_from(a * b, FM_FROM_LIBC);
  if (p != NULL)
    memset(p, 0, a * b);
  return p;
}

void *__wrap_realloc(void *p, size_t n) {
  return realloc_from(p, n, FM_FROM_LIBC);
}

void __wrap_free(void *p) {
  free_from(p);
}

char *__wrap_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = alloc_from(n, FM_FROM_LIBC);
  if (d != NULL)
    memcpy(d, s, n);
  return d;
}

char *__wrap_strndup(const char *s, size_t max) {
  size_t n = strnlen(s, max);
  char *d = alloc_from(n + 1, FM_FROM_LIBC);
  if (d != NULL) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/*
 * jansson 2.14's parser is not safe against a failed allocation: lex_save()
 * drops a failed growth of its token buffer and goes on with the token cut
 * short (a heap overflow in lex_scan_string, or an assert), and a failed
 * string copy comes out as a syntax error, not json_error_out_of_memory
 * (akheron/jansson#362, unfixed in 2.14). So inside a parse only its first
 * allocation may fail (the lexer's buffer: the parse then returns NULL with
 * no error text, which the library must take as out of memory); those the
 * library makes around a parse, and jansson's own everywhere else
 * (building, dumping), all may.
 *
 * json_dumps has the same flaw: do_dump ignores a failed write of an
 * object's key, so a failed growth of its output buffer gives text with
 * the key cut short, not NULL. Only its first allocation (the buffer
 * itself, whose failure returns NULL) may fail there.
 */
char *__wrap_json_dumps(const json_t *j, size_t f) {
  in_json_dumps++;
  long saved = dumps_allocs;
  dumps_allocs = 0;
  char *s = __real_json_dumps(j, f);
  dumps_allocs = saved;
  in_json_dumps--;
  return s;
}

json_t *__wrap_json_loadb(const char *b, size_t n, size_t f, json_error_t *e) {
  in_json_load++;
  long saved = load_allocs;
  load_allocs = 0;
  json_t *j = __real_json_loadb(b, n, f, e);
  load_allocs = saved;
  in_json_load--;
  return j;
}

json_t *__wrap_json_loads(const char *s, size_t f, json_error_t *e) {
  in_json_load++;
  long saved = load_allocs;
  load_allocs = 0;
  json_t *j = __real_json_loads(s, f, e);
  load_allocs = saved;
  in_json_load--;
  return j;
}

static void *json_alloc(size_t n) {
  return alloc_from(n, FM_FROM_JANSSON);
}

static void *ossl_alloc(size_t n, const char *file, int line) {
  (void)file;
  (void)line;
  return alloc_from(n, FM_FROM_OPENSSL);
}

static void *ossl_realloc(void *p, size_t n, const char *file, int line) {
  (void)file;
  (void)line;
  return realloc_from(p, n, FM_FROM_OPENSSL);
}

static void ossl_free(void *p, const char *file, int line) {
  (void)file;
  (void)line;
  free_from(p);
}

bool fm_install(void) {
  show_stack = getenv("OOM_BACKTRACE") != NULL;
  json_set_alloc_funcs(json_alloc, free_from);
  return CRYPTO_set_mem_functions(ossl_alloc, ossl_realloc, ossl_free) == 1;
}

void fm_begin(long n, bool persistent) {
  pthread_mutex_lock(&mu);
  gen++;
  counter = 0;
  fail_at = n;
  fail_after = persistent;
  failed = false;
  failed_from = FM_FROM_LIBC;
  live = 0;
  tracking = true;
  pthread_mutex_unlock(&mu);
}

void fm_end(void) {
  pthread_mutex_lock(&mu);
  tracking = false;
  pthread_mutex_unlock(&mu);
}

long fm_count(void) {
  pthread_mutex_lock(&mu);
  long n = counter;
  pthread_mutex_unlock(&mu);
  return n;
}

bool fm_failed(fm_source *from) {
  pthread_mutex_lock(&mu);
  bool f = failed;
  if (from != NULL)
    *from = failed_from;
  pthread_mutex_unlock(&mu);
  return f;
}

long fm_live(size_t *first_size) {
  pthread_mutex_lock(&mu);
  long n = live;
  if (first_size != NULL) {
    *first_size = 0;
    for (size_t i = 0; i < TABLE_SIZE && n > 0; i++)
      if (table[i].gen == gen && table[i].p != NULL) {
        *first_size = table[i].size;
        break;
      }
  }
  pthread_mutex_unlock(&mu);
  return n;
}
