/*
 * tests/unit/test_classify.c - categories, the error classifier, UTF-8-safe
 * truncation, whitespace collapsing and the compact error record.
 *
 * The "data" suite replays shared/data/errors.jsonl (265 real error texts with
 * guessed labels) and prints the agreement and a confusion summary; it
 * asserts a floor below the measured figure, not the figure itself (skipped,
 * saying so, when ../shared is not beside the project). The "fixtures"
 * suite replays the project's own tests/fixtures/errors.jsonl, where every
 * text must get its label.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agentguard/core.h"
#include "core/internal.h"

#ifndef AG_SHARED_DIR
#define AG_SHARED_DIR "../shared"
#endif

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* Classifies a copy of text in a buffer of exactly strlen(text) bytes, so a
 * read past `len` is caught by AddressSanitizer. */
static ag_category classify_exact(const char *text) {
  size_t n = strlen(text);
  char *copy = malloc(n > 0 ? n : 1);
  cr_assert_not_null(copy);
  memcpy(copy, text, n);
  ag_category c = ag_classify(copy, n);
  free(copy);
  return c;
}

#define EXPECT_CAT(text, want)                                                 \
  do {                                                                         \
    ag_category got_ = classify_exact(text);                                   \
    cr_expect_eq(got_, (want), "classify(\"%s\"): got %s, want %s", (text),    \
                 ag_category_name(got_), ag_category_name(want));              \
  } while (0)

#define EXPECT_NOT_CAT(text, unwanted)                                         \
  do {                                                                         \
    ag_category got_ = classify_exact(text);                                   \
    cr_expect_neq(got_, (unwanted), "classify(\"%s\"): got %s", (text),        \
                  ag_category_name(got_));                                     \
  } while (0)

/* True when s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF).
 */
static bool valid_utf8(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0)
        lo = 0xA0;
      if (c == 0xED)
        hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0)
        lo = 0x90;
      if (c == 0xF4)
        hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi)
      return false;
    for (size_t k = 2; k < len; k++)
      if ((s[i + k] & 0xC0) != 0x80)
        return false;
    i += len;
  }
  return true;
}

static bool ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

/* Reference collapse: whole text, no limit; returns a malloc'ed string. */
static char *ref_collapse(const char *s, size_t n, size_t *out_len) {
  char *o = malloc(n + 1);
  size_t k = 0;
  bool pending = false;
  for (size_t i = 0; i < n; i++) {
    if (ws(s[i])) {
      pending = k > 0;
      continue;
    }
    if (pending)
      o[k++] = ' ';
    pending = false;
    o[k++] = s[i];
  }
  o[k] = '\0';
  *out_len = k;
  return o;
}

/* ------------------------------------------------------------------------ */
/* Categories                                                               */
/* ------------------------------------------------------------------------ */

Test(category, names_round_trip) {
  for (int i = 0; i < AG_CAT__COUNT; i++) {
    const char *name = ag_category_name((ag_category)i);
    cr_assert_not_null(name);
    cr_expect_eq(ag_category_from_name(name), (ag_category)i,
                 "from_name(\"%s\") != %d", name, i);
  }
  cr_expect_str_eq(ag_category_name(AG_CAT_NOT_FOUND), "not_found");
  cr_expect_str_eq(ag_category_name(AG_CAT_MISSING_MODULE), "missing_module");
  cr_expect_eq(ag_category_from_name("nope"), AG_CAT__COUNT);
  cr_expect_eq(ag_category_from_name("Timeout"), AG_CAT__COUNT);
  cr_expect_eq(ag_category_from_name(""), AG_CAT__COUNT);
  cr_expect_eq(ag_category_from_name(NULL), AG_CAT__COUNT);
  /* Out-of-range values never crash and read as unknown. */
  cr_expect_str_eq(ag_category_name(AG_CAT__COUNT), "unknown");
  cr_expect_str_eq(ag_category_name((ag_category)-1), "unknown");
}

Test(category, transient_flags) {
  for (int i = 0; i < AG_CAT__COUNT; i++) {
    ag_category c = (ag_category)i;
    bool want = c == AG_CAT_TIMEOUT || c == AG_CAT_RATE_LIMIT ||
                c == AG_CAT_NETWORK || c == AG_CAT_BUSY;
    cr_expect_eq(ag_category_transient(c), want, "transient(%s) = %d",
                 ag_category_name(c), (int)ag_category_transient(c));
  }
  cr_expect_not(ag_category_transient(AG_CAT__COUNT));
}

Test(category, suggestions) {
  for (int i = 0; i < AG_CAT__COUNT; i++) {
    const char *s = ag_category_suggestion((ag_category)i);
    cr_assert_not_null(s);
    cr_expect_gt(strlen(s), 10, "suggestion for %s too short",
                 ag_category_name((ag_category)i));
    cr_expect_null(strchr(s, '\n'), "one line");
  }
  /* Seed 003's table. */
  cr_expect_str_eq(ag_category_suggestion(AG_CAT_TIMEOUT),
                   "Try a simpler query or a smaller dataset");
  cr_expect_str_eq(ag_category_suggestion(AG_CAT_AUTH),
                   "Check credentials or request human approval");
  cr_expect_str_eq(ag_category_suggestion(AG_CAT_VALIDATION),
                   "Check input format against the schema");
  cr_expect_str_eq(ag_category_suggestion(AG_CAT_NOT_FOUND),
                   "Verify the resource exists or list available options");
  cr_expect_str_eq(ag_category_suggestion(AG_CAT_RATE_LIMIT),
                   "Wait and retry, or use an alternative API");
  cr_expect_not_null(
      strstr(ag_category_suggestion(AG_CAT_MISSING_MODULE), "Install"));
  cr_expect_str_eq(ag_category_suggestion(AG_CAT__COUNT),
                   ag_category_suggestion(AG_CAT_UNKNOWN));
}

/* ------------------------------------------------------------------------ */
/* Classifier: hand-checked cases                                           */
/* ------------------------------------------------------------------------ */

/* Drawn from shared/data/errors.jsonl (shortened where marked "..."). */
Test(classify, cases_from_data) {
  EXPECT_CAT("ModuleNotFoundError: No module named 'psycopg2'",
             AG_CAT_MISSING_MODULE);
  EXPECT_CAT("ImportError: cannot import name 'Tr' from 'sympy' "
             "(/testbed/sympy/__init__.py)",
             AG_CAT_MISSING_MODULE);
  EXPECT_CAT("rm: cannot remove 'fix.py': No such file or directory",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("django.db.utils.OperationalError: no such table: auth_group",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("/bin/bash: line 2881: docker: command not found",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("<tool_use_error>Error: No such tool available: "
             "bash</tool_use_error>",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("Error: payment method certificate_7504069 not found",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("The last command <command>pytest "
             "xarray/tests/test_units.py</command> timed out and has been "
             "killed.\nThe output of the command was:\n<output>\n...",
             AG_CAT_TIMEOUT);
  EXPECT_CAT("Error executing MCP tool:\nMCP error -32001: Request timed out",
             AG_CAT_TIMEOUT);
  EXPECT_CAT("grep: ./tests/invalid_models_tests: Is a directory",
             AG_CAT_FILE_IO);
  EXPECT_CAT("EISDIR: illegal operation on a directory, read", AG_CAT_FILE_IO);
  EXPECT_CAT("Error: File 'ReproduceIssue.java' already exists.",
             AG_CAT_FILE_IO);
  EXPECT_CAT("grep: /proc/sys/kernel/apparmor_display_secid_mode: Operation "
             "not permitted",
             AG_CAT_PERMISSION);
  EXPECT_CAT("npm ERR! code EACCES\nnpm ERR! syscall mkdir\nnpm ERR! Error: "
             "EACCES: permission denied, mkdir "
             "'/usr/local/lib/node_modules/nodemon'\nnpm ERR! A complete log "
             "of this run can be found in: /root/.npm/_logs/x-debug-0.log",
             AG_CAT_PERMISSION);
  EXPECT_CAT("json.decoder.JSONDecodeError: Expecting property name enclosed "
             "in double quotes: line 3 column 25 (char 27)",
             AG_CAT_VALIDATION);
  EXPECT_CAT("/bin/bash: line 1: syntax error near unexpected token `('",
             AG_CAT_VALIDATION);
  EXPECT_CAT("openai.AuthenticationError: Error code: 401 - {'error': "
             "{'message': 'Incorrect API key provided: sk-xx. You can find "
             "your API key at https://platform.openai.com/account/api-keys.', "
             "'type': 'invalid_request_error', 'code': 'invalid_api_key'}}",
             AG_CAT_AUTH);
  EXPECT_CAT("Cloning into 'cs220'...\ngit@github.com: Permission denied "
             "(publickey).\nfatal: Could not read from remote repository.\n\n"
             "Please make sure you have the correct access rights\nand the "
             "repository exists.",
             AG_CAT_AUTH);
  EXPECT_CAT("anthropic._exceptions.OverloadedError: Error code: 529 - "
             "{'type': 'error', 'error': {'type': 'overloaded_error', "
             "'message': 'Overloaded'}}",
             AG_CAT_RATE_LIMIT);
  EXPECT_CAT("scan failed: GitHub API 403 for /repos/x/y: {\"message\":\"API "
             "rate limit exceeded for 93.185.106.128.\"}",
             AG_CAT_RATE_LIMIT);
  EXPECT_CAT("503 Service Unavailable (error code: 0): upstream connect error "
             "or disconnect/reset before headers. reset reason: remote "
             "connection failure, transport failure reason: immediate connect "
             "error: No such file or directory",
             AG_CAT_NETWORK);
  EXPECT_CAT("upstream error: Post \"http://localhost:3000\": dial tcp "
             "127.0.0.1:3000: connect: connection refused",
             AG_CAT_NETWORK);
  EXPECT_CAT("requests.exceptions.ConnectionError: "
             "HTTPSConnectionPool(host='www.example.com', port=443): Max "
             "retries exceeded with url: /example (Caused by "
             "NewConnectionError('<urllib3.connection.VerifiedHTTPSConnection "
             "object at 0x7fb37cc09940>: Failed to establish a new connection: "
             "[Errno -2] Name or service not known',))",
             AG_CAT_NETWORK);
  EXPECT_CAT("openai.BadRequestError: Error code: 400 - {'error': {'message': "
             "\"This model's maximum context length is 8192 tokens. However, "
             "your messages resulted in 8227 tokens.\", 'code': "
             "'context_length_exceeded'}}",
             AG_CAT_RESOURCE);
  EXPECT_CAT("<--- JS stacktrace --->\n\nFATAL ERROR: Reached heap limit "
             "Allocation failed - JavaScript heap out of memory\n 1: 0xb8d11b "
             "node::OOMErrorHandler(char const*, v8::OOMDetails const&) [node]",
             AG_CAT_RESOURCE);
  EXPECT_CAT("The output of your last command was too long.\nPlease try a "
             "different command that produces less output.",
             AG_CAT_RESOURCE);
}

/* Common tool errors. */
Test(classify, common_tool_errors) {
  EXPECT_CAT(
      "Traceback (most recent call last):\n"
      "  File \"/work/analyze.py\", line 12, in <module>\n"
      "    df = pd.read_csv(\"data/sales.csv\")\n"
      "  File \"/usr/lib/python3/dist-packages/pandas/io/common.py\", "
      "line 859, in get_handle\n"
      "    handle = open(handle, ioargs.mode, encoding=ioargs.encoding)\n"
      "FileNotFoundError: [Errno 2] No such file or directory: "
      "'data/sales.csv'\n",
      AG_CAT_NOT_FOUND);
  EXPECT_CAT("bash: foo: command not found", AG_CAT_NOT_FOUND);
  EXPECT_CAT("fatal: not a git repository (or any of the parent "
             "directories): .git",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("Error: ENOENT: no such file or directory, open 'config.json'",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("Unknown tool: search_web", AG_CAT_NOT_FOUND);
  EXPECT_CAT("requests.exceptions.HTTPError: 404 Client Error: Not Found for "
             "url: https://api.example.com/v1/items/7",
             AG_CAT_NOT_FOUND);
  EXPECT_CAT("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\n"
             "Content-Type: application/json\r\n\r\n{\"error\":\"slow down\"}",
             AG_CAT_RATE_LIMIT);
  EXPECT_CAT("HTTP 429", AG_CAT_RATE_LIMIT);
  EXPECT_CAT("Connection refused", AG_CAT_NETWORK);
  EXPECT_CAT("curl: (7) Failed to connect to localhost port 8080 after 0 ms: "
             "Connection refused",
             AG_CAT_NETWORK);
  EXPECT_CAT("fatal: unable to access 'https://github.com/a/b.git/': Could "
             "not resolve host: github.com",
             AG_CAT_NETWORK);
  EXPECT_CAT("HTTPError: 502 Server Error: Bad Gateway for url: "
             "https://api.example.com/",
             AG_CAT_NETWORK);
  EXPECT_CAT("504 Gateway Timeout", AG_CAT_NETWORK);
  EXPECT_CAT("Permission denied", AG_CAT_PERMISSION);
  EXPECT_CAT("cat: /etc/shadow: Permission denied", AG_CAT_PERMISSION);
  EXPECT_CAT("OSError: [Errno 28] No space left on device", AG_CAT_RESOURCE);
  EXPECT_CAT("No space left on device", AG_CAT_RESOURCE);
  EXPECT_CAT("MemoryError", AG_CAT_RESOURCE);
  EXPECT_CAT("Killed", AG_CAT_RESOURCE);
  EXPECT_CAT("ModuleNotFoundError: No module named 'numpy'",
             AG_CAT_MISSING_MODULE);
  EXPECT_CAT("Error: Cannot find module 'dotenv'\nRequire stack:\n- "
             "/app/index.js",
             AG_CAT_MISSING_MODULE);
  EXPECT_CAT("database is locked", AG_CAT_BUSY);
  EXPECT_CAT("sqlite3.OperationalError: database is locked", AG_CAT_BUSY);
  EXPECT_CAT("fatal: Unable to create '/repo/.git/index.lock': File exists.",
             AG_CAT_BUSY);
  EXPECT_CAT("/bin/sh: 1: ./run.sh: Text file busy", AG_CAT_BUSY);
  EXPECT_CAT("BlockingIOError: [Errno 11] Resource temporarily unavailable",
             AG_CAT_BUSY);
  EXPECT_CAT("Function timed out after 30s", AG_CAT_TIMEOUT);
  EXPECT_CAT("Error after 4 attempts: Function timed out after 30s",
             AG_CAT_TIMEOUT);
  EXPECT_CAT("Error after 4 attempts: Connection refused", AG_CAT_NETWORK);
  EXPECT_CAT("Error after 4 attempts: HTTP 503 from upstream", AG_CAT_NETWORK);
  EXPECT_CAT("context deadline exceeded", AG_CAT_TIMEOUT);
  EXPECT_CAT("IsADirectoryError: [Errno 21] Is a directory: 'src'",
             AG_CAT_FILE_IO);
  EXPECT_CAT("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in "
             "position 0: invalid start byte",
             AG_CAT_FILE_IO);
  EXPECT_CAT("Invalid arguments: missing required field 'path'",
             AG_CAT_VALIDATION);
  EXPECT_CAT("TypeError: __init__() got an unexpected keyword argument "
             "'timeout'",
             AG_CAT_VALIDATION);
  EXPECT_CAT("usage: grep [OPTION]... PATTERNS [FILE]...", AG_CAT_VALIDATION);
  EXPECT_CAT("HTTPError: 401 Client Error: Unauthorized for url: "
             "https://api.github.com/user",
             AG_CAT_AUTH);
  EXPECT_CAT("{\"message\": \"Bad credentials\", \"status\": \"401\"}",
             AG_CAT_AUTH);
  EXPECT_CAT("findfont: Font family ['Arial'] not found. Falling back to "
             "DejaVu Sans.",
             AG_CAT_FONT);
  EXPECT_CAT("UserWarning: Glyph 26085 (\\N{CJK UNIFIED IDEOGRAPH-65E5}) "
             "missing from current font.",
             AG_CAT_FONT);
  EXPECT_CAT("_tkinter.TclError: no display name and no $DISPLAY environment "
             "variable",
             AG_CAT_PLOTTING);
  EXPECT_CAT("UserWarning: Matplotlib is currently using agg, which is a "
             "non-GUI backend, so cannot show the figure.",
             AG_CAT_PLOTTING);
  EXPECT_CAT("ValueError: x and y must have same first dimension, but have "
             "shapes (10,) and (9,)",
             AG_CAT_PLOTTING);
}

/* Texts that must not be caught by the obvious substring. */
/* A tool killed by a signal crashed: it is not short of memory (issue 10,
 * finding 13), except for the signals that are limits or the OOM killer. */
Test(classify, crashes_are_not_resource) {
  EXPECT_CAT("killed by signal 11 (Segmentation fault)", AG_CAT_CRASH);
  EXPECT_CAT("killed by signal 6 (Aborted)", AG_CAT_CRASH);
  EXPECT_CAT("killed by signal 7 (Bus error)", AG_CAT_CRASH);
  EXPECT_CAT("Segmentation fault (core dumped)", AG_CAT_CRASH);
  EXPECT_CAT("/bin/sh: line 1: 4242 Aborted                 (core dumped) "
             "./a.out",
             AG_CAT_CRASH);
  EXPECT_CAT("*** stack smashing detected ***: terminated", AG_CAT_CRASH);
  EXPECT_CAT("free(): invalid pointer", AG_CAT_CRASH);
  EXPECT_CAT("Fatal Python error: Segmentation fault", AG_CAT_CRASH);
  EXPECT_CAT("Process finished with SIGSEGV", AG_CAT_CRASH);
  EXPECT_CAT("==12==ERROR: AddressSanitizer: heap-use-after-free",
             AG_CAT_CRASH);
  /* Still resource: the OOM killer's SIGKILL and the rlimit signals. */
  EXPECT_CAT("killed by signal 9 (Killed)", AG_CAT_RESOURCE);
  EXPECT_CAT("killed by signal 24 (CPU time limit exceeded)", AG_CAT_RESOURCE);
  EXPECT_CAT("Killed", AG_CAT_RESOURCE);
  /* Permanent, with a suggestion that fits a crash. */
  cr_expect_not(ag_category_transient(AG_CAT_CRASH));
  cr_expect_str_eq(ag_category_name(AG_CAT_CRASH), "crash");
  cr_expect_not_null(strstr(ag_category_suggestion(AG_CAT_CRASH), "crashed"));
  /* Appended: the numbers of the older categories did not move. */
  cr_expect_eq((int)AG_CAT_PLOTTING, 13);
  cr_expect_eq((int)AG_CAT_CRASH, 14);
}

Test(classify, deliberate_negatives) {
  /* "404" as a line number, inside a number, in a test count. */
  EXPECT_CAT("Traceback (most recent call last):\n"
             "  File \"/srv/api/views.py\", line 404, in get\n"
             "    assert total == 3\n"
             "AssertionError",
             AG_CAT_UNKNOWN);
  EXPECT_CAT("Processed 14045 records, 404 skipped", AG_CAT_UNKNOWN);
  EXPECT_CAT("===== 1 failed, 503 passed in 2.10s =====", AG_CAT_UNKNOWN);
  EXPECT_CAT("Error on line 503: unexpected character '}'", AG_CAT_UNKNOWN);
  EXPECT_NOT_CAT("error: port 503 is not a number", AG_CAT_NETWORK);
  /* "auth" inside "author". */
  EXPECT_CAT("error: invalid author name", AG_CAT_VALIDATION);
  EXPECT_CAT("author: Jane Doe", AG_CAT_UNKNOWN);
  /* "timeout" inside a parameter name. */
  EXPECT_CAT("KeyError: 'timeout_seconds'", AG_CAT_VALIDATION);
  /* A generic word deep in a traceback is not the failure. */
  EXPECT_CAT("Traceback (most recent call last):\n"
             "  File \"client.py\", line 40, in fetch\n"
             "    resp = session.get(url, timeout=timeout)\n"
             "  File \"client.py\", line 52, in check\n"
             "    assert resp.ok\n"
             "AssertionError",
             AG_CAT_UNKNOWN);
  /* Words that merely contain a pattern. */
  EXPECT_CAT("error: call of overloaded 'f(int)' is ambiguous", AG_CAT_UNKNOWN);
  EXPECT_CAT("    at throttle (node_modules/lodash/throttle.js:12:3)",
             AG_CAT_UNKNOWN);
  EXPECT_CAT("All 12 tests passed", AG_CAT_UNKNOWN);
  EXPECT_CAT("AssertionError: assert 3 == 2", AG_CAT_UNKNOWN);
  EXPECT_CAT("memory usage: 80%", AG_CAT_UNKNOWN);
  EXPECT_CAT("failed to decode video stream", AG_CAT_UNKNOWN);
  EXPECT_CAT("EIO", AG_CAT_FILE_IO);
  EXPECT_CAT("", AG_CAT_UNKNOWN);
  cr_expect_eq(ag_classify(NULL, 0), AG_CAT_UNKNOWN);
  cr_expect_eq(ag_classify(NULL, 10), AG_CAT_UNKNOWN);
}

Test(classify, case_insensitive_and_binary) {
  EXPECT_CAT("PERMISSION DENIED", AG_CAT_PERMISSION);
  EXPECT_CAT("ModuleNOTFoundError: x", AG_CAT_MISSING_MODULE);
  /* NUL bytes are data; the length decides. */
  static const char with_nul[] = "x\0y\0database is locked";
  cr_expect_eq(ag_classify(with_nul, sizeof(with_nul) - 1), AG_CAT_BUSY);
  cr_expect_eq(ag_classify(with_nul, 3), AG_CAT_UNKNOWN);
  /* Only `len` bytes are read. */
  static const char longer[] = "Connection refused";
  cr_expect_eq(ag_classify(longer, 10), AG_CAT_UNKNOWN);
  cr_expect_eq(ag_classify(longer, sizeof(longer) - 1), AG_CAT_NETWORK);
  /* High bytes and invalid UTF-8 do not disturb matching. */
  static const char bin[] = "\xff\xfe\x80 \xc3\xa9 No such file or directory";
  cr_expect_eq(ag_classify(bin, sizeof(bin) - 1), AG_CAT_NOT_FOUND);
}

Test(classify, large_texts) {
  size_t n = 10u << 20;
  char *big = malloc(n);
  cr_assert_not_null(big);
  for (size_t i = 0; i < n; i++)
    big[i] = (i % 61 == 60) ? '\n' : (char)('a' + i % 26);
  const char *tail = "\nPermission denied";
  memcpy(big + n - strlen(tail), tail, strlen(tail));
  cr_expect_eq(ag_classify(big, n), AG_CAT_PERMISSION);
  const char *head = "No space left on device\n";
  memcpy(big, head, strlen(head));
  memset(big + n - strlen(tail), 'z', strlen(tail));
  cr_expect_eq(ag_classify(big, n), AG_CAT_RESOURCE);
  free(big);
}

/* `*` is a gap within one line, found wherever it is on the line. */
Test(classify, gaps_stay_on_one_line) {
  EXPECT_CAT("Glyph 12 MISSING", AG_CAT_FONT);
  EXPECT_CAT("glyph glyph 1 missing", AG_CAT_FONT);
  EXPECT_CAT("glyph\nmissing", AG_CAT_UNKNOWN);
  EXPECT_CAT("expected int got str", AG_CAT_VALIDATION);
  EXPECT_CAT("expected expected x but", AG_CAT_VALIDATION);
  EXPECT_CAT("expected int\ngot str", AG_CAT_UNKNOWN);
}

/* A status code needs its announcing word within the 40 bytes before it. */
Test(classify, status_code_window) {
  EXPECT_CAT("status                              429", AG_CAT_RATE_LIMIT);
  EXPECT_CAT("status                                    429", AG_CAT_UNKNOWN);
  EXPECT_CAT("429", AG_CAT_UNKNOWN);
  EXPECT_CAT("HTTP 429", AG_CAT_RATE_LIMIT);
}

/* `unit` repeated to n bytes, then `tail`; a malloc'ed string. */
static char *repeat(const char *unit, size_t n, const char *tail) {
  size_t u = strlen(unit), t = strlen(tail);
  char *b = malloc(n + t + 1);
  cr_assert_not_null(b);
  for (size_t i = 0; i < n; i++)
    b[i] = unit[i % u];
  memcpy(b + n, tail, t + 1);
  return b;
}

/* One long line full of near-misses (the shape of minified CSS or a row of
 * numbers): a match at its end is still found. */
Test(classify, long_lines_of_near_misses) {
  static const struct {
    const char *unit, *tail;
    ag_category want;
  } cases[] = {
      {"font-size:12px;", "", AG_CAT_UNKNOWN},
      {"font-size:12px;", " font x not available", AG_CAT_FONT},
      {"font-size:12px;", "\nfont x not available", AG_CAT_FONT},
      {"glyph ", "", AG_CAT_UNKNOWN},
      {"glyph ", "missing", AG_CAT_FONT},
      {"404 ", "", AG_CAT_UNKNOWN},
      {"404 ", "HTTP error 429", AG_CAT_RATE_LIMIT},
      {"line 404 ", "status 503", AG_CAT_NETWORK},
      {"connection x ", "", AG_CAT_UNKNOWN},
      {"connection x ", "connection refused", AG_CAT_NETWORK},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    for (size_t n = 1000; n <= 200000; n *= 200) {
      char *text = repeat(cases[i].unit, n, cases[i].tail);
      ag_category got = classify_exact(text);
      cr_expect_eq(got, cases[i].want, "\"%s\" x %zu + \"%s\": got %s, want %s",
                   cases[i].unit, n, cases[i].tail, ag_category_name(got),
                   ag_category_name(cases[i].want));
      free(text);
    }
  }
}

/* Texts over 64 KiB: the first 16 KiB and the last 48 KiB are read, and a
 * line of the tail comes after every line of the head. */
static ag_category classify_long(const char *const *put, const size_t *at,
                                 size_t count) {
  size_t n = 100000;
  char *b = malloc(n);
  cr_assert_not_null(b);
  for (size_t i = 0; i < n; i++)
    b[i] = (i % 61 == 60) ? '\n' : (char)('a' + i % 26);
  for (size_t i = 0; i < count; i++)
    memcpy(b + at[i], put[i], strlen(put[i]));
  ag_category c = ag_classify(b, n);
  free(b);
  return c;
}

Test(classify, windows_of_long_texts) {
  size_t n = 100000, head_end = 16384, tail_start = n - 49152;
  const char *t1_t1[] = {"No space left on device\n", "\nPermission denied"};
  size_t at_ends[] = {0, n - 18};
  cr_expect_eq(classify_long(t1_t1, at_ends, 2), AG_CAT_PERMISSION);
  const char *t1_t2[] = {"No space left on device\n", "\nKeyError\n"};
  size_t at_ends2[] = {0, n - 10};
  cr_expect_eq(classify_long(t1_t2, at_ends2, 2), AG_CAT_RESOURCE);
  const char *t2_t3[] = {"KeyError: x\n", "\nbusy\n"};
  size_t at_ends3[] = {0, n - 6};
  cr_expect_eq(classify_long(t2_t3, at_ends3, 2), AG_CAT_VALIDATION);

  const char *pd[] = {"\nPermission denied\n"};
  size_t middle[] = {40000};
  cr_expect_eq(classify_long(pd, middle, 1), AG_CAT_UNKNOWN);
  size_t across_head_end[] = {head_end - 8};
  cr_expect_eq(classify_long(pd, across_head_end, 1), AG_CAT_UNKNOWN);
  size_t across_tail_start[] = {tail_start - 8};
  cr_expect_eq(classify_long(pd, across_tail_start, 1), AG_CAT_UNKNOWN);
  size_t at_tail_start[] = {tail_start - 1};
  cr_expect_eq(classify_long(pd, at_tail_start, 1), AG_CAT_PERMISSION);
  size_t ending_at_head_end[] = {head_end - 19};
  cr_expect_eq(classify_long(pd, ending_at_head_end, 1), AG_CAT_PERMISSION);
}

/* The first calls may come from several threads at once. */
static const struct {
  const char *text;
  ag_category want;
} thread_cases[] = {
    {"ModuleNotFoundError: No module named 'numpy'", AG_CAT_MISSING_MODULE},
    {"HTTP/1.1 429 Too Many Requests", AG_CAT_RATE_LIMIT},
    {"cat: /etc/shadow: Permission denied", AG_CAT_PERMISSION},
    {"Function timed out after 30s", AG_CAT_TIMEOUT},
    {"AssertionError: assert 3 == 2", AG_CAT_UNKNOWN},
};

static void *classify_in_thread(void *arg) {
  long *wrong = arg;
  for (int round = 0; round < 200; round++)
    for (size_t i = 0; i < sizeof(thread_cases) / sizeof(thread_cases[0]); i++)
      if (ag_classify(thread_cases[i].text, strlen(thread_cases[i].text)) !=
          thread_cases[i].want)
        (*wrong)++;
  return NULL;
}

Test(classify, concurrent_first_use) {
  enum { NTHREADS = 8 };
  pthread_t th[NTHREADS];
  long wrong[NTHREADS] = {0};
  for (int i = 0; i < NTHREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, classify_in_thread, &wrong[i]),
                 0);
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(wrong[i], 0, "thread %d: %ld wrong", i, wrong[i]);
  }
}

/* ------------------------------------------------------------------------ */
/* Classifier: agreement with shared/data/errors.jsonl                      */
/* ------------------------------------------------------------------------ */

/* Skips the running test, saying so on stderr (`make test` lists these
 * lines) and to Criterion, when `path` is missing: ../shared is not beside
 * a clone of the project alone. */
static void skip_without(const char *path, const char *instead) {
  if (access(path, R_OK) == 0)
    return;
  fprintf(stderr,
          "skipped: %s::%s: %s not found (../shared is not beside the "
          "project); %s runs instead\n",
          criterion_current_test->category, criterion_current_test->name, path,
          instead);
  cr_skip_test("skipped: %s not found (../shared is not beside the project); "
               "%s runs instead",
               path, instead);
}

/* Replays a JSON Lines file of {"text", LABEL_KEY, optional "label_alt"}
 * rows, prints the agreement and returns it in percent; at least `min_rows`
 * rows. */
static double agreement(const char *path, const char *label_key, int min_rows) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "cannot open %s", path);
  int total = 0, agree = 0, exact = 0;
  int confusion[AG_CAT__COUNT][AG_CAT__COUNT];
  int per_label[AG_CAT__COUNT], per_label_ok[AG_CAT__COUNT];
  memset(confusion, 0, sizeof(confusion));
  memset(per_label, 0, sizeof(per_label));
  memset(per_label_ok, 0, sizeof(per_label_ok));
  char *line = NULL;
  size_t line_cap = 0;
  ssize_t got;
  while ((got = getline(&line, &line_cap, f)) > 0) {
    json_error_t jerr;
    json_t *row = json_loadb(line, (size_t)got, 0, &jerr);
    cr_assert_not_null(row, "line %d: %s", total + 1, jerr.text);
    json_t *text = json_object_get(row, "text");
    const char *label = json_string_value(json_object_get(row, label_key));
    const char *alt = json_string_value(json_object_get(row, "label_alt"));
    cr_assert(json_is_string(text) && label != NULL);
    ag_category want = ag_category_from_name(label);
    ag_category want_alt = alt ? ag_category_from_name(alt) : AG_CAT__COUNT;
    cr_assert_neq(want, AG_CAT__COUNT, "label %s", label);
    ag_category c =
        ag_classify(json_string_value(text), json_string_length(text));
    total++;
    per_label[want]++;
    if (c == want)
      exact++;
    if (c == want || c == want_alt) {
      agree++;
      per_label_ok[want]++;
    } else {
      confusion[want][c]++;
    }
    json_decref(row);
  }
  free(line);
  fclose(f);
  cr_assert_geq(total, min_rows, "only %d rows in %s", total, path);

  double pct = 100.0 * agree / total;
  printf("%s: %d rows, agreement %d (%.1f%%) counting label_alt, "
         "%d (%.1f%%) exact label\n",
         path, total, agree, pct, exact, 100.0 * exact / total);
  printf("  per label (agree/total):");
  for (int i = 0; i < AG_CAT__COUNT; i++)
    if (per_label[i] > 0)
      printf(" %s %d/%d", ag_category_name((ag_category)i), per_label_ok[i],
             per_label[i]);
  printf("\n  disagreements (label -> classified: count):");
  for (int i = 0; i < AG_CAT__COUNT; i++)
    for (int j = 0; j < AG_CAT__COUNT; j++)
      if (confusion[i][j] > 0)
        printf(" %s->%s:%d", ag_category_name((ag_category)i),
               ag_category_name((ag_category)j), confusion[i][j]);
  printf("\n");
  fflush(stdout);
  return pct;
}

Test(data, errors_jsonl_agreement) {
  const char *path = AG_SHARED_DIR "/data/errors.jsonl";
  skip_without(path, "fixtures::errors_jsonl");
  double pct = agreement(path, "label_guess", 201);
  /* Measured 92.8% when written; the labels are guesses, so keep margin. */
  cr_expect_geq(pct, 85.0, "agreement %.1f%% below the 85%% floor", pct);
}

/* tests/fixtures/errors.jsonl: error texts written for this project, one or
 * more per category in the style of docs/errors.md's table, each labelled
 * with the category that table gives it. Unlike the real texts' guessed
 * labels, every one must agree. */
Test(fixtures, errors_jsonl) {
  double pct =
      agreement(AG_SOURCE_DIR "/tests/fixtures/errors.jsonl", "label", 40);
  cr_expect_eq(pct, 100.0, "agreement %.1f%%: every fixture must agree", pct);
}

/* ------------------------------------------------------------------------ */
/* UTF-8 truncation                                                         */
/* ------------------------------------------------------------------------ */

#define EXPECT_TRUNC(text, len, max, want)                                     \
  do {                                                                         \
    size_t got_ = ag_utf8_truncate((text), (len), (max));                      \
    cr_expect_eq(got_, (size_t)(want),                                         \
                 "truncate(len %zu, max %zu) = %zu, "                          \
                 "want %zu",                                                   \
                 (size_t)(len), (size_t)(max), got_, (size_t)(want));          \
  } while (0)

Test(utf8, ascii_and_limits) {
  EXPECT_TRUNC("abc", 3, 0, 0);
  EXPECT_TRUNC("abc", 3, 2, 2);
  EXPECT_TRUNC("abc", 3, 3, 3);
  EXPECT_TRUNC("abc", 3, 100, 3);
  EXPECT_TRUNC("", 0, 5, 0);
  cr_expect_eq(ag_utf8_truncate(NULL, 0, 5), 0);
}

Test(utf8, two_byte_at_cut) {
  const char *s = "a\xc3\xa9"
                  "b"; /* a é b */
  EXPECT_TRUNC(s, 4, 1, 1);
  EXPECT_TRUNC(s, 4, 2, 1); /* inside é */
  EXPECT_TRUNC(s, 4, 3, 3);
  EXPECT_TRUNC(s, 4, 4, 4);
}

Test(utf8, three_byte_at_cut) {
  const char *s = "x\xe2\x82\xac"; /* x € */
  EXPECT_TRUNC(s, 4, 1, 1);
  EXPECT_TRUNC(s, 4, 2, 1);
  EXPECT_TRUNC(s, 4, 3, 1);
  EXPECT_TRUNC(s, 4, 4, 4);
  const char *t = "\xe2\x82\xac\xe2\x82\xac"; /* €€ */
  EXPECT_TRUNC(t, 6, 5, 3);
  EXPECT_TRUNC(t, 6, 3, 3);
}

Test(utf8, four_byte_at_cut) {
  const char *s = "y\xf0\x9f\x98\x80z"; /* y 😀 z */
  EXPECT_TRUNC(s, 6, 1, 1);
  EXPECT_TRUNC(s, 6, 2, 1);
  EXPECT_TRUNC(s, 6, 3, 1);
  EXPECT_TRUNC(s, 6, 4, 1);
  EXPECT_TRUNC(s, 6, 5, 5);
  EXPECT_TRUNC("\xf0\x9f\x98\x80", 4, 3, 0);
}

Test(utf8, invalid_bytes_count_as_one_char) {
  /* Stray continuation bytes. */
  EXPECT_TRUNC("\x80\x80\x80\x80", 4, 2, 2);
  EXPECT_TRUNC("a\x80\x80\x80\x80", 5, 3, 3);
  /* A lead byte whose sequence is broken by the next byte. */
  EXPECT_TRUNC("\xe2\x82z", 3, 1, 1);
  EXPECT_TRUNC("\xe2\x82z", 3, 2, 2);
  /* Overlong, surrogate, above U+10FFFF, 0xFF. */
  EXPECT_TRUNC("\xc0\xaf", 2, 1, 1);
  EXPECT_TRUNC("\xe0\x80\x80", 3, 2, 2);
  EXPECT_TRUNC("\xed\xa0\x80", 3, 2, 2);
  EXPECT_TRUNC("\xf4\x90\x80\x80", 4, 2, 2);
  EXPECT_TRUNC("\xff\xff", 2, 1, 1);
  /* The text itself ends inside a sequence: the lone lead is one char. */
  EXPECT_TRUNC("a\xe2\x82", 3, 2, 2);
  EXPECT_TRUNC("a\xe2\x82", 3, 3, 3);
  /* Valid sequences at the edge of the allowed ranges. */
  EXPECT_TRUNC("\xed\x9f\xbf!", 4, 2, 0);     /* U+D7FF */
  EXPECT_TRUNC("\xf4\x8f\xbf\xbf!", 5, 3, 0); /* U+10FFFF */
}

/* ------------------------------------------------------------------------ */
/* Whitespace collapsing (internal)                                         */
/* ------------------------------------------------------------------------ */

Test(collapse, basics) {
  char buf[64];
  bool cut = true;
  const char *s = " \t a \t\n\r\f\v b  c\n\n";
  size_t n = ag__collapse_ws(buf, sizeof(buf), s, strlen(s), 0, &cut);
  cr_expect_str_eq(buf, "a b c");
  cr_expect_eq(n, 5);
  cr_expect_not(cut);

  n = ag__collapse_ws(buf, sizeof(buf), "   \n\t ", 6, 0, &cut);
  cr_expect_eq(n, 0);
  cr_expect_str_eq(buf, "");
  cr_expect_not(cut);

  n = ag__collapse_ws(buf, sizeof(buf), "hello world", 11, 6, &cut);
  cr_expect_str_eq(buf, "hello", "trailing space after a cut is dropped");
  cr_expect(cut);

  n = ag__collapse_ws(buf, 3, "abcdef", 6, 0, &cut);
  cr_expect_str_eq(buf, "ab");
  cr_expect_eq(n, 2);
  cr_expect(cut);

  n = ag__collapse_ws(buf, sizeof(buf), "a\xc3\xa9", 3, 2, &cut);
  cr_expect_str_eq(buf, "a");
  cr_expect(cut);

  n = ag__collapse_ws(buf, sizeof(buf), "abc   ", 6, 3, &cut);
  cr_expect_str_eq(buf, "abc");
  cr_expect_not(cut, "only whitespace was dropped");

  n = ag__collapse_ws(buf, sizeof(buf), "abc", 3, 0, NULL);
  cr_expect_eq(n, 3);

  /* cap 0 writes nothing; cap 1 writes the NUL. */
  buf[0] = 'X';
  n = ag__collapse_ws(buf, 0, "abc", 3, 0, &cut);
  cr_expect_eq(n, 0);
  cr_expect_eq(buf[0], 'X');
  cr_expect(cut);
  n = ag__collapse_ws(buf, 1, "abc", 3, 0, &cut);
  cr_expect_eq(n, 0);
  cr_expect_eq(buf[0], '\0');
  cr_expect(cut);
}

/* Random inputs against a reference implementation. */
Test(collapse, matches_reference) {
  static const char alphabet[] = " \t\n\ra\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                                 "\x80\xff";
  unsigned seed = 12345;
  char in[64], out[80];
  for (int iter = 0; iter < 20000; iter++) {
    size_t n = (size_t)(iter % 40);
    for (size_t i = 0; i < n; i++) {
      seed = seed * 1103515245u + 12345u;
      in[i] = alphabet[(seed >> 16) % (sizeof(alphabet) - 1)];
    }
    seed = seed * 1103515245u + 12345u;
    size_t max = (seed >> 16) % 24;
    size_t cap = 1 + (seed >> 8) % 30;
    size_t ref_len;
    char *ref = ref_collapse(in, n, &ref_len);
    size_t limit = cap - 1;
    if (max > 0 && max < limit)
      limit = max;
    size_t want = ref_len;
    bool want_cut = false;
    if (ref_len > limit) {
      want_cut = true;
      want = ag_utf8_truncate(ref, ref_len, limit);
      if (want > 0 && ref[want - 1] == ' ')
        want--;
    }
    bool cut;
    size_t got = ag__collapse_ws(out, cap, in, n, max, &cut);
    cr_assert_eq(got, want, "iter %d: got %zu want %zu (cap %zu max %zu)", iter,
                 got, want, cap, max);
    cr_assert_eq(cut, want_cut, "iter %d", iter);
    cr_assert_eq(memcmp(out, ref, got), 0, "iter %d", iter);
    cr_assert_eq(out[got], '\0');
    free(ref);
  }
}

/* ------------------------------------------------------------------------ */
/* Compact error record                                                     */
/* ------------------------------------------------------------------------ */

Test(compact, exact_format) {
  char buf[512];
  const char *msg = "  FileNotFoundError:\n  [Errno 2] No such file or "
                    "directory: 'x.csv'  \n";
  size_t n = ag_format_compact_error(buf, sizeof(buf), "read_file",
                                     AG_CAT_NOT_FOUND, msg, strlen(msg), 200);
  const char *want = "<error>\n"
                     "tool: read_file\n"
                     "type: not_found\n"
                     "message: FileNotFoundError: [Errno 2] No such file or "
                     "directory: 'x.csv'\n"
                     "suggestion: Verify the resource exists or list "
                     "available options\n"
                     "</error>";
  cr_expect_str_eq(buf, want);
  cr_expect_eq(n, strlen(want));
}

Test(compact, every_category_has_type_and_suggestion) {
  char buf[512], want[512];
  for (int i = 0; i < AG_CAT__COUNT; i++) {
    ag_category c = (ag_category)i;
    size_t n =
        ag_format_compact_error(buf, sizeof(buf), "t", c, "boom", 4, 200);
    snprintf(want, sizeof(want),
             "<error>\ntool: t\ntype: %s\nmessage: boom\nsuggestion: "
             "%s\n</error>",
             ag_category_name(c), ag_category_suggestion(c));
    cr_expect_str_eq(buf, want);
    cr_expect_eq(n, strlen(want));
  }
}

Test(compact, cut_message) {
  char buf[512];
  /* 300 bytes of "é" (2 bytes each): 200 is a boundary, 201 is not. */
  char msg[300];
  for (size_t i = 0; i < sizeof(msg); i += 2) {
    msg[i] = '\xc3';
    msg[i + 1] = '\xa9';
  }
  for (size_t max = 195; max <= 205; max++) {
    size_t n = ag_format_compact_error(buf, sizeof(buf), "t", AG_CAT_VALIDATION,
                                       msg, sizeof(msg), max);
    cr_assert_eq(n, strlen(buf));
    const char *m = strstr(buf, "message: ") + 9;
    const char *end = strchr(m, '\n');
    size_t mlen = (size_t)(end - m);
    cr_expect_eq(mlen, (max & ~(size_t)1) + 3, "max %zu: message %zu bytes",
                 max, mlen);
    cr_expect_eq(memcmp(end - 3, "...", 3), 0, "ends with ...");
    cr_expect(valid_utf8(m, mlen), "valid UTF-8 at max %zu", max);
  }
  /* No cut, no dots; max 0 means no cut at all. */
  size_t n = ag_format_compact_error(buf, sizeof(buf), "t", AG_CAT_UNKNOWN,
                                     "short", 5, 200);
  cr_expect_null(strstr(buf, "..."));
  cr_expect_eq(n, strlen(buf));
  n = ag_format_compact_error(buf, sizeof(buf), "t", AG_CAT_UNKNOWN, msg,
                              sizeof(msg), 0);
  cr_expect_eq(n, strlen(buf));
  cr_expect_null(strstr(buf, "..."));
  /* Whitespace collapsed before the cut: "a  b  c  d" -> "a b c"... */
  n = ag_format_compact_error(buf, sizeof(buf), "t", AG_CAT_UNKNOWN,
                              "a  b\n\nc  d", 10, 5);
  cr_expect_not_null(strstr(buf, "message: a b c...\n"), "%s", buf);
  /* A cut that would end in a space drops it. */
  n = ag_format_compact_error(buf, sizeof(buf), "t", AG_CAT_UNKNOWN, "abc def",
                              7, 4);
  cr_expect_not_null(strstr(buf, "message: abc...\n"), "%s", buf);
}

Test(compact, ten_megabytes_into_512_bytes) {
  size_t n = 10u << 20;
  char *msg = malloc(n);
  cr_assert_not_null(msg);
  static const char unit[] = "word\xe2\x82\xac  \n\t ";
  for (size_t i = 0; i < n; i++)
    msg[i] = unit[i % (sizeof(unit) - 1)];
  char *buf = malloc(512 + 64);
  cr_assert_not_null(buf);
  memset(buf, 0x5A, 512 + 64);

  size_t head = strlen("<error>\ntool: big\ntype: resource\nmessage: ");
  size_t tail = strlen("\nsuggestion: \n</error>") +
                strlen(ag_category_suggestion(AG_CAT_RESOURCE));

  /* Cut at 200: the full record is small but the message is counted. */
  size_t got =
      ag_format_compact_error(buf, 512, "big", AG_CAT_RESOURCE, msg, n, 200);
  size_t want_msg;
  {
    size_t prefix_len; /* the first 4 KiB collapse to the same prefix */
    char *prefix = ref_collapse(msg, 4096, &prefix_len);
    want_msg = ag_utf8_truncate(prefix, prefix_len, 200);
    if (prefix[want_msg - 1] == ' ')
      want_msg--;
    free(prefix);
  }
  cr_expect_eq(got, head + want_msg + 3 + tail);
  cr_expect_eq(strlen(buf), got < 512 ? got : 511);

  /* No cut: the returned length counts all 10 MB, collapsed. */
  size_t ref_len;
  char *ref = ref_collapse(msg, n, &ref_len);
  got = ag_format_compact_error(buf, 512, "big", AG_CAT_RESOURCE, msg, n, 0);
  cr_expect_eq(got, head + ref_len + tail, "got %zu want %zu", got,
               head + ref_len + tail);
  cr_expect_eq(strlen(buf), 511);
  cr_expect_eq(memcmp(buf + head, ref, 511 - head), 0);
  for (size_t i = 512; i < 512 + 64; i++)
    cr_assert_eq((unsigned char)buf[i], 0x5A, "overrun at %zu", i);
  free(ref);
  free(buf);
  free(msg);
}

Test(compact, small_caps_are_snprintf_like) {
  char full[512];
  const char *msg = "Connection refused by 10.0.0.1:443";
  size_t want = ag_format_compact_error(full, sizeof(full), "fetch",
                                        AG_CAT_NETWORK, msg, strlen(msg), 200);
  cr_assert_eq(want, strlen(full));

  /* cap 0: nothing written, length returned; NULL allowed. */
  char guard[4] = {'X', 'X', 'X', 'X'};
  cr_expect_eq(ag_format_compact_error(guard, 0, "fetch", AG_CAT_NETWORK, msg,
                                       strlen(msg), 200),
               want);
  cr_expect_eq(guard[0], 'X');
  cr_expect_eq(ag_format_compact_error(NULL, 0, "fetch", AG_CAT_NETWORK, msg,
                                       strlen(msg), 200),
               want);
  /* cap 1: only the NUL. */
  cr_expect_eq(ag_format_compact_error(guard, 1, "fetch", AG_CAT_NETWORK, msg,
                                       strlen(msg), 200),
               want);
  cr_expect_eq(guard[0], '\0');
  cr_expect_eq(guard[1], 'X');

  /* Every cap gives a NUL-terminated prefix of the full record. */
  char *buf = malloc(want + 16);
  cr_assert_not_null(buf);
  for (size_t cap = 1; cap <= want + 2; cap++) {
    memset(buf, 0x5A, want + 16);
    size_t n = ag_format_compact_error(buf, cap, "fetch", AG_CAT_NETWORK, msg,
                                       strlen(msg), 200);
    cr_assert_eq(n, want, "cap %zu", cap);
    size_t k = cap - 1 < want ? cap - 1 : want;
    cr_assert_eq(buf[k], '\0', "cap %zu", cap);
    cr_assert_eq(memcmp(buf, full, k), 0, "cap %zu", cap);
    for (size_t i = cap; i < want + 16; i++)
      cr_assert_eq((unsigned char)buf[i], 0x5A, "cap %zu: overrun at %zu", cap,
                   i);
  }
  free(buf);

  /* NULL tool and NULL message read as empty. */
  char b2[512];
  ag_format_compact_error(b2, sizeof(b2), NULL, AG_CAT_UNKNOWN, NULL, 0, 200);
  cr_expect_not_null(strstr(b2, "tool: \ntype: unknown\nmessage: \n"), "%s",
                     b2);
}
