/*
 * src/core/failure.c - what a failed call means: information or a
 * malfunction (docs/errors.md, "Information and malfunctions").
 *
 * A failure is information when the tool did its job and what failed is
 * the work the agent is doing: a test that fails, a reproduction script
 * that exits 1 on purpose, a compiler error after an edit, an exception
 * raised by the program under work. The agent reads it and acts on it; a
 * run of them is how debugging looks. A failure is a malfunction when the
 * tool loop itself goes wrong: a command that does not exist, a call the
 * tool refuses (bad arguments, a usage error, an editor misused), an unknown
 * tool, a timeout, a permission, network or rate-limit error.
 *
 * Information needs evidence in the text that a program ran and reported
 * on the work: a stack trace (Python's traceback, a JVM, Node or Go stack),
 * a compiler's located diagnostic ("file.ext:LINE:" on a line that says
 * error, rustc's "error[E", tsc's "error TS", Maven's "file.java:[LINE,")
 * or a test runner's report (pytest's "FAILED" and "AssertionError",
 * unittest's "FAIL:", JUnit's "Tests run:", Maven's "BUILD FAILURE", Go's
 * "--- FAIL:"). Without it a failure is a malfunction, as every failure was
 * before: a bare "Error: ..." tells nothing of its cause. And whatever the
 * text shows, the classifier's categories of the environment - timeout,
 * rate_limit, network, busy, auth, permission, resource, missing_module -
 * are malfunctions: a program that cannot import its dependencies or
 * reach its server is not the work failing.
 */
#include <string.h>

#include "internal.h"

/* Texts longer than this are read in their first and last halves of it: a
 * trace is at the top (a compiler's first error) or the bottom (Python). */
#define SCAN_MAX (64u << 10)

/* Whether `needle` occurs in t[0..n). */
static bool has(const char *t, size_t n, const char *needle) {
  size_t m = strlen(needle);
  for (const char *p = t; m <= n && (size_t)(p - t) <= n - m; p++) {
    p = memchr(p, needle[0], n - m + 1 - (size_t)(p - t));
    if (p == NULL)
      return false;
    if (memcmp(p, needle, m) == 0)
      return true;
  }
  return false;
}

/* Whether the text shows a program's stack trace or a compiler's located
 * diagnostic. */
static bool has_trace(const char *t, size_t n) {
  static const char *const marks[] = {
      "Traceback (most recent call last)", /* Python */
      "Exception in thread \"",            /* JVM */
      "\n\tat ",                           /* JVM stack frame */
      "Caused by: ",                       /* JVM */
      "\n    at ",                         /* Node, .NET */
      "error[E",                           /* rustc */
      "error TS",                          /* tsc */
      "panic: ",                           /* Go */
      "goroutine 1 [",                     /* Go */
  };
  for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++)
    if (has(t, n, marks[k]))
      return true;
  /* "NAME.EXT:LINE:" (gcc, clang, javac, go, python -m py_compile) or
   * "NAME.EXT:[LINE," (Maven) on a line that says "error" */
  for (size_t i = 0; i + 3 < n; i++) {
    if (t[i] != '.' || !(t[i + 1] >= 'a' && t[i + 1] <= 'z'))
      continue;
    size_t j = i + 1;
    while (j < n && j - i <= 6 && t[j] >= 'a' && t[j] <= 'z')
      j++;
    if (j + 1 >= n || t[j] != ':')
      continue;
    size_t d = j + 1 + (t[j + 1] == '[');
    if (d >= n || t[d] < '0' || t[d] > '9')
      continue;
    const char *eol = memchr(t + d, '\n', n - d);
    size_t end = eol != NULL ? (size_t)(eol - t) : n;
    size_t bol = i;
    while (bol > 0 && t[bol - 1] != '\n')
      bol--;
    if (has(t + bol, end - bol, "error") || has(t + bol, end - bol, "Error") ||
        has(t + bol, end - bol, "ERROR"))
      return true;
    i = end; /* one look per line */
  }
  return false;
}

/* Whether the text is a test runner's report of failing tests. */
static bool has_test_report(const char *t, size_t n) {
  static const char *const marks[] = {
      "AssertionError", /* Python, Node's assert */
      "FAILED ",        /* pytest "FAILED t.py::x", unittest "FAILED (" */
      "FAILED (",       /* unittest */
      "\nFAIL: ",       /* unittest */
      "= FAILURES =",   /* pytest */
      "Tests run: ",    /* JUnit, Maven Surefire */
      "BUILD FAILURE",  /* Maven */
      "--- FAIL: ",     /* go test */
      "\nFAIL\t",       /* go test */
      "Test failed",    /* npm */
      "ComparisonFailure", "AssertionFailedError", /* JUnit */
  };
  for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++)
    if (has(t, n, marks[k]))
      return true;
  return false;
}

static bool evidence(const char *t, size_t n) {
  return has_trace(t, n) || has_test_report(t, n);
}

bool ag__failure_is_information(ag_category cat, const char *text, size_t len) {
  switch (cat) {
  case AG_CAT_TIMEOUT:
  case AG_CAT_RATE_LIMIT:
  case AG_CAT_NETWORK:
  case AG_CAT_BUSY:
  case AG_CAT_AUTH:
  case AG_CAT_PERMISSION:
  case AG_CAT_RESOURCE:
  case AG_CAT_MISSING_MODULE:
    return false; /* the environment */
  default:
    break;
  }
  if (len <= SCAN_MAX)
    return evidence(text, len);
  return evidence(text, SCAN_MAX / 2) ||
         evidence(text + len - SCAN_MAX / 2, SCAN_MAX / 2);
}
