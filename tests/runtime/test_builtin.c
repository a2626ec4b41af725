/*
 * tests/runtime/test_builtin.c - the built-in tools (src/exec/builtin.c) and
 * their confinement beneath the workdir (src/exec/workdir.c): every tool's
 * behaviour, caps and errors; a corpus of escape attempts run under both
 * resolvers (openat2 and the forced component walk) with 0 escapes; a
 * rename race against both; run_command's registration, approval flag,
 * working directory, exit statuses and timeout.
 *
 * Each test builds its own tree under a fresh temporary directory:
 *   T/secret.txt             "TOP-SECRET" - outside the workdir
 *   T/wd/                    the workdir
 *   T/wd/a.txt               "alpha\nbeta\ngamma\n"
 *   T/wd/sub/b.txt           "inside b\n"
 *   T/wd/to_etc -> /etc, to_secret -> ../secret.txt, to_parent -> ..,
 *   T/wd/chain1 -> chain2 -> ../secret.txt, abs_secret -> T/secret.txt,
 *   T/wd/sub/up -> ../.., T/wd/dir_link -> sub, T/wd/in_link -> sub/b.txt,
 *   T/wd/dangling_out -> ../created_outside.txt,
 *   T/wd/dangling_in -> made_by_link.txt
 */
#define _GNU_SOURCE /* renameat2 */

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agentguard/exec.h"
#include "exec/internal.h"

#define SECRET "TOP-SECRET"

static char T[PATH_MAX];      /* the temporary top directory */
static char WD[PATH_MAX + 8]; /* T/wd */

static void put(const char *rel, const char *text) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/%s", T, rel);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f, "cannot create %s", p);
  fputs(text, f);
  fclose(f);
}

static void link_at(const char *target, const char *rel) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/%s", T, rel);
  cr_assert_eq(symlink(target, p), 0, "symlink %s: %s", p, strerror(errno));
}

static void mkdir_at(const char *rel) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/%s", T, rel);
  cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s", p);
}

static bool exists_at(const char *rel) {
  char p[PATH_MAX * 2];
  struct stat st;
  snprintf(p, sizeof(p), "%s/%s", T, rel);
  return lstat(p, &st) == 0;
}

/* The whole of T/rel, or "" (malloc'd). */
static char *slurp(const char *rel) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/%s", T, rel);
  FILE *f = fopen(p, "rb");
  char *buf = calloc(1, 1 << 20);
  cr_assert_not_null(buf);
  if (f != NULL) {
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
  }
  return buf;
}

static void make_tree(void) {
  snprintf(T, sizeof(T), "/tmp/ag_builtin_XXXXXX");
  cr_assert_not_null(mkdtemp(T));
  snprintf(WD, sizeof(WD), "%s/wd", T);
  put("secret.txt", SECRET "\n");
  mkdir_at("wd");
  mkdir_at("wd/sub");
  put("wd/a.txt", "alpha\nbeta\ngamma\n");
  put("wd/sub/b.txt", "inside b\n");
  link_at("/etc", "wd/to_etc");
  link_at("../secret.txt", "wd/to_secret");
  link_at("..", "wd/to_parent");
  link_at("chain2", "wd/chain1");
  link_at("../secret.txt", "wd/chain2");
  char abs[PATH_MAX * 2];
  snprintf(abs, sizeof(abs), "%s/secret.txt", T);
  link_at(abs, "wd/abs_secret");
  link_at("../..", "wd/sub/up");
  link_at("sub", "wd/dir_link");
  link_at("sub/b.txt", "wd/in_link");
  link_at("../created_outside.txt", "wd/dangling_out");
  link_at("made_by_link.txt", "wd/dangling_in");
}

static void remove_tree(void) {
  if (T[0] != '\0') {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", T);
    cr_expect_eq(system(cmd), 0);
  }
}

/* A registry with the built-in tools over WD. */
static ag_registry *make_reg(ag_resolve_mode mode, bool commands, bool yes) {
  ag_registry *reg = NULL;
  ag_error_t err;
  cr_assert_eq(ag_registry_new(&reg, &err), AG_OK);
  ag_builtin_opts o;
  ag_builtin_opts_init(&o);
  o.workdir = WD;
  o.resolve = mode;
  o.allow_commands = commands;
  o.yes = yes;
  o.max_read_bytes = 1024;
  o.max_write_bytes = 2048;
  o.max_list_entries = 5;
  o.max_matches = 3;
  o.max_output = 4096;
  ag_err_t rc = ag_builtin_register(reg, &o, &err);
  cr_assert_eq(rc, AG_OK, "register: %s", err.msg);
  return reg;
}

typedef struct tres {
  ag_tool_status st;
  char text[1 << 16];
} tres;

/* Validates `args` (JSON text) against the tool's schema, then runs it on
 * this thread with `cancel` (may be NULL). */
static void call_c(ag_registry *reg, const char *tool, const char *args,
                   ag_cancel *cancel, tres *r) {
  const ag_tool_def *d = ag_registry_get(reg, tool);
  cr_assert_not_null(d, "no tool %s", tool);
  json_error_t jerr;
  json_t *a = json_loads(args, JSON_ALLOW_NUL, &jerr);
  cr_assert_not_null(a, "bad test args %s: %s", args, jerr.text);
  ag_error_t err;
  ag_err_t v = ag_registry_validate(reg, tool, a, &err);
  cr_assert_eq(v, AG_OK, "%s %s: %s", tool, args, err.msg);
  ag_output o;
  cr_assert_eq(ag__output_init(&o, d->max_output > 0 ? d->max_output : 1 << 20),
               AG_OK);
  r->st = d->fn(d->user, a, cancel, &o);
  snprintf(r->text, sizeof(r->text), "%s", o.buf != NULL ? o.buf : "");
  ag__output_free(&o);
  json_decref(a);
}

static void call(ag_registry *reg, const char *tool, const char *args,
                 tres *r) {
  call_c(reg, tool, args, NULL, r);
}

static tres R; /* one result buffer; tests run one at a time */

#define EXPECT_OK(reg, tool, args)                                             \
  do {                                                                         \
    call(reg, tool, args, &R);                                                 \
    cr_assert_eq(R.st, AG_TOOL_OK, "%s %s failed: %s", tool, args, R.text);    \
  } while (0)

#define EXPECT_ERR(reg, tool, args, needle)                                    \
  do {                                                                         \
    call(reg, tool, args, &R);                                                 \
    cr_assert_eq(R.st, AG_TOOL_ERROR, "%s %s should fail; got: %s", tool,      \
                 args, R.text);                                                \
    cr_assert(strstr(R.text, needle) != NULL, "%s %s: expected \"%s\" in: %s", \
              tool, args, needle, R.text);                                     \
  } while (0)

static const ag_resolve_mode k_modes[] = {AG_RESOLVE_OPENAT2, AG_RESOLVE_WALK};
static const char *const k_mode_names[] = {"openat2", "walk"};

TestSuite(builtin, .init = make_tree, .fini = remove_tree);

/* ------------------------------------------------------------------------ */
/* Registration                                                             */
/* ------------------------------------------------------------------------ */

Test(builtin, registers_five_tools_and_run_command_only_when_allowed) {
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  cr_assert_eq(ag_registry_count(reg), 5);
  const char *names[] = {"read_file", "write_file", "edit_file", "list_dir",
                         "search_text"};
  for (size_t i = 0; i < 5; i++) {
    const ag_tool_def *d = ag_registry_get(reg, names[i]);
    cr_assert_not_null(d, "%s missing", names[i]);
    cr_assert(d->description != NULL && strlen(d->description) > 40);
    cr_assert_not(d->requires_approval, "%s", names[i]);
  }
  cr_assert_null(ag_registry_get(reg, "run_command"));
  /* The schemas reach the model's tool list. */
  json_t *tools = ag_registry_tools_json(reg);
  char *dump = json_dumps(tools, 0);
  cr_assert(strstr(dump, "\"start_line\"") != NULL, "%s", dump);
  free(dump);
  json_decref(tools);
  ag_registry_free(reg);

  reg = make_reg(AG_RESOLVE_AUTO, true, false);
  const ag_tool_def *rc = ag_registry_get(reg, "run_command");
  cr_assert_not_null(rc);
  cr_assert(rc->requires_approval);
  cr_assert_not(rc->idempotent);
  cr_assert_eq(rc->max_retries, 0);
  ag_registry_free(reg);

  reg = make_reg(AG_RESOLVE_AUTO, true, true);
  cr_assert_not(ag_registry_get(reg, "run_command")->requires_approval);
  ag_registry_free(reg);
}

Test(builtin, registration_errors) {
  ag_registry *reg = NULL;
  ag_error_t err;
  cr_assert_eq(ag_registry_new(&reg, &err), AG_OK);
  ag_builtin_opts o;
  ag_builtin_opts_init(&o);
  cr_assert_eq(ag_builtin_register(reg, &o, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "no workdir") != NULL, "%s", err.msg);

  char missing[PATH_MAX * 2];
  snprintf(missing, sizeof(missing), "%s/nope", T);
  o.workdir = missing;
  cr_assert_eq(ag_builtin_register(reg, &o, &err), AG_ENOTFOUND);
  cr_assert(strstr(err.msg, "nope") != NULL, "%s", err.msg);
  cr_assert_eq(ag_registry_count(reg), 0);

  /* A tool already named like a built-in: nothing is added. */
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "list_dir";
  static const char *const argv[] = {"true", NULL};
  d.argv = argv;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK);
  o.workdir = WD;
  cr_assert_eq(ag_builtin_register(reg, &o, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "tools.list_dir") != NULL, "%s", err.msg);
  cr_assert_eq(ag_registry_count(reg), 1);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* read_file                                                                */
/* ------------------------------------------------------------------------ */

Test(builtin, read_file_whole_ranges_and_errors) {
  for (size_t m = 0; m < 2; m++) {
    ag_registry *reg = make_reg(k_modes[m], false, false);
    EXPECT_OK(reg, "read_file", "{\"path\": \"a.txt\"}");
    cr_assert_str_eq(R.text, "alpha\nbeta\ngamma\n", "%s", k_mode_names[m]);
    EXPECT_OK(reg, "read_file", "{\"path\": \"./sub/../a.txt\"}");
    cr_assert_str_eq(R.text, "alpha\nbeta\ngamma\n");
    EXPECT_OK(reg, "read_file", "{\"path\": \"in_link\"}");
    cr_assert_str_eq(R.text, "inside b\n");
    EXPECT_OK(reg, "read_file", "{\"path\": \"dir_link/b.txt\"}");
    cr_assert_str_eq(R.text, "inside b\n");
    EXPECT_OK(reg, "read_file",
              "{\"path\": \"a.txt\", \"start_line\": 2, \"end_line\": 2}");
    cr_assert_str_eq(R.text, "beta\n");
    EXPECT_OK(reg, "read_file", "{\"path\": \"a.txt\", \"start_line\": 2}");
    cr_assert_str_eq(R.text, "beta\ngamma\n");
    EXPECT_OK(reg, "read_file", "{\"path\": \"a.txt\", \"end_line\": 1}");
    cr_assert_str_eq(R.text, "alpha\n");
    EXPECT_OK(reg, "read_file",
              "{\"path\": \"a.txt\", \"start_line\": 3, \"end_line\": 99}");
    cr_assert_str_eq(R.text, "gamma\n");
    EXPECT_ERR(reg, "read_file", "{\"path\": \"a.txt\", \"start_line\": 4}",
               "start_line 4 is past the end of a.txt (3 lines)");
    EXPECT_ERR(reg, "read_file",
               "{\"path\": \"a.txt\", \"start_line\": 3, \"end_line\": 2}",
               "end_line 2 is before start_line 3");
    EXPECT_ERR(reg, "read_file", "{\"path\": \"nope.txt\"}",
               "no such file or directory: nope.txt");
    EXPECT_ERR(reg, "read_file", "{\"path\": \"sub\"}",
               "sub is a directory; use list_dir");
    EXPECT_ERR(reg, "read_file", "{\"path\": \"a.txt/x\"}",
               "not a directory: a.txt/x");
    ag_registry_free(reg);
  }
}

Test(builtin, read_file_caps_binary_and_fifo) {
  /* 1024 bytes is the test cap: 200 lines of 10 bytes is 2000. */
  char big[2001];
  for (int i = 0; i < 200; i++)
    snprintf(big + i * 10, 11, "line %04d\n", i + 1);
  put("wd/big.txt", big);
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  EXPECT_ERR(reg, "read_file", "{\"path\": \"big.txt\"}",
             "big.txt is larger than 1 KiB (2000 bytes); read a line range "
             "with start_line and end_line");
  EXPECT_OK(reg, "read_file",
            "{\"path\": \"big.txt\", \"start_line\": 150, \"end_line\": 151}");
  cr_assert_str_eq(R.text, "line 0150\nline 0151\n");
  EXPECT_ERR(reg, "read_file",
             "{\"path\": \"big.txt\", \"start_line\": 1, \"end_line\": 200}",
             "lines 1-200 of big.txt are more than 1 KiB; read a smaller "
             "range");

  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/bin.dat", WD);
  FILE *f = fopen(p, "wb");
  fwrite("ab\0cd", 1, 5, f);
  fclose(f);
  EXPECT_ERR(reg, "read_file", "{\"path\": \"bin.dat\"}", "binary file");

  /* A FIFO neither blocks nor is read. */
  snprintf(p, sizeof(p), "%s/fifo", WD);
  cr_assert_eq(mkfifo(p, 0600), 0);
  EXPECT_ERR(reg, "read_file", "{\"path\": \"fifo\"}",
             "fifo is not a regular file");
  EXPECT_ERR(reg, "write_file", "{\"path\": \"fifo\", \"content\": \"x\"}",
             "not a regular file");
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* write_file, edit_file                                                    */
/* ------------------------------------------------------------------------ */

Test(builtin, write_file_creates_overwrites_and_caps) {
  for (size_t m = 0; m < 2; m++) {
    ag_registry *reg = make_reg(k_modes[m], false, false);
    EXPECT_OK(reg, "write_file",
              "{\"path\": \"new/deeper/n.txt\", \"content\": \"hello\\n\"}");
    cr_assert(strstr(R.text, "Created new/deeper/n.txt (6 bytes)") != NULL,
              "%s", R.text);
    char *got = slurp("wd/new/deeper/n.txt");
    cr_assert_str_eq(got, "hello\n");
    free(got);
    EXPECT_OK(reg, "write_file",
              "{\"path\": \"new/deeper/n.txt\", \"content\": \"bye\"}");
    cr_assert(strstr(R.text, "Wrote new/deeper/n.txt (3 bytes)") != NULL, "%s",
              R.text);
    got = slurp("wd/new/deeper/n.txt");
    cr_assert_str_eq(got, "bye");
    free(got);
    /* Through a symlinked directory inside, and a dangling link inside. */
    EXPECT_OK(reg, "write_file",
              "{\"path\": \"dir_link/c.txt\", \"content\": \"c\"}");
    got = slurp("wd/sub/c.txt");
    cr_assert_str_eq(got, "c");
    free(got);
    EXPECT_OK(reg, "write_file",
              "{\"path\": \"dangling_in\", \"content\": \"via link\"}");
    got = slurp("wd/made_by_link.txt");
    cr_assert_str_eq(got, "via link");
    free(got);
    EXPECT_ERR(reg, "write_file", "{\"path\": \"sub/\", \"content\": \"x\"}",
               "names a directory");
    EXPECT_ERR(reg, "write_file", "{\"path\": \"sub\", \"content\": \"x\"}",
               "sub");
    ag_registry_free(reg);
    char cmd[PATH_MAX * 4];
    snprintf(cmd, sizeof(cmd),
             "rm -rf '%s/new' '%s/sub/c.txt' '%s/made_by_link.txt'", WD, WD,
             WD);
    cr_assert_eq(system(cmd), 0);
  }
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  char args[8192];
  char body[2100];
  memset(body, 'x', 2049);
  body[2049] = '\0';
  snprintf(args, sizeof(args), "{\"path\": \"big.txt\", \"content\": \"%s\"}",
           body);
  EXPECT_ERR(reg, "write_file", args,
             "content is 2049 bytes; write_file writes at most 2 KiB");
  cr_assert_not(exists_at("wd/big.txt"));
  ag_registry_free(reg);
}

Test(builtin, edit_file_exact_unique_replacement) {
  put("wd/e.txt", "one\ntwo\nthree\ntwo\n");
  for (size_t m = 0; m < 2; m++) {
    put("wd/e.txt", "one\ntwo\nthree\ntwo\n");
    ag_registry *reg = make_reg(k_modes[m], false, false);
    EXPECT_OK(reg, "edit_file",
              "{\"path\": \"e.txt\", \"old_string\": \"three\", "
              "\"new_string\": \"THREE and more\"}");
    cr_assert(strstr(R.text, "line 3") != NULL, "%s", R.text);
    char *got = slurp("wd/e.txt");
    cr_assert_str_eq(got, "one\ntwo\nTHREE and more\ntwo\n");
    free(got);
    /* Shrinking. */
    EXPECT_OK(reg, "edit_file",
              "{\"path\": \"e.txt\", \"old_string\": \"THREE and more\\n\", "
              "\"new_string\": \"\"}");
    got = slurp("wd/e.txt");
    cr_assert_str_eq(got, "one\ntwo\ntwo\n");
    free(got);
    EXPECT_ERR(reg, "edit_file",
               "{\"path\": \"e.txt\", \"old_string\": \"two\", "
               "\"new_string\": \"2\"}",
               "old_string occurs 2 times in e.txt (lines 2, 3); include "
               "more surrounding text");
    EXPECT_ERR(reg, "edit_file",
               "{\"path\": \"e.txt\", \"old_string\": \"four\", "
               "\"new_string\": \"4\"}",
               "old_string not found in e.txt; read the file again");
    EXPECT_ERR(reg, "edit_file",
               "{\"path\": \"e.txt\", \"old_string\": \"one\", "
               "\"new_string\": \"one\"}",
               "the same");
    got = slurp("wd/e.txt");
    cr_assert_str_eq(got, "one\ntwo\ntwo\n", "failed edits change nothing");
    free(got);
    EXPECT_ERR(reg, "edit_file",
               "{\"path\": \"nope\", \"old_string\": \"a\", "
               "\"new_string\": \"b\"}",
               "no such file or directory: nope");
    ag_registry_free(reg);
  }
  /* The result's cap (2 KiB in these tests). */
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  char args[8192], body[1500];
  memset(body, 'y', 1000);
  body[1000] = '\0';
  put("wd/e.txt", "AAA\n");
  snprintf(args, sizeof(args),
           "{\"path\": \"e.txt\", \"old_string\": \"A\", \"new_string\": "
           "\"%s\"}",
           body);
  EXPECT_ERR(reg, "edit_file", args, "occurs 3 times");
  put("wd/e.txt", "A\n");
  EXPECT_OK(reg, "edit_file", args);
  memset(body, 'y', 1100);
  body[1100] = '\0';
  snprintf(args, sizeof(args),
           "{\"path\": \"e.txt\", \"old_string\": \"y\\n\", \"new_string\": "
           "\"%s\"}",
           body);
  EXPECT_ERR(reg, "edit_file", args, "the edited file would be 2099 bytes");
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* list_dir, search_text                                                    */
/* ------------------------------------------------------------------------ */

Test(builtin, list_dir_sorted_marked_and_capped) {
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  EXPECT_OK(reg, "list_dir", "{\"path\": \"sub\"}");
  cr_assert_str_eq(R.text, "b.txt\nup@\n");
  EXPECT_OK(reg, "list_dir", "{\"path\": \"dir_link/\"}");
  cr_assert_str_eq(R.text, "b.txt\nup@\n");
  /* 12 entries at the top, 5 shown: the first 5 by name. */
  EXPECT_OK(reg, "list_dir", "{}");
  cr_assert_str_eq(R.text,
                   "a.txt\nabs_secret@\nchain1@\nchain2@\ndangling_in@\n"
                   "[7 more entries not shown: list_dir shows the first 5 by "
                   "name; list a subdirectory or use search_text]\n");
  mkdir_at("wd/empty");
  EXPECT_OK(reg, "list_dir", "{\"path\": \"empty\"}");
  cr_assert_str_eq(R.text, "(empty is empty)\n");
  EXPECT_ERR(reg, "list_dir", "{\"path\": \"a.txt\"}", "not a directory");
  ag_registry_free(reg);
}

Test(builtin, search_text_fixed_regex_case_caps) {
  put("wd/s1.txt", "needle a.b here\nnothing\nA.B upper\n");
  mkdir_at("wd/deep");
  put("wd/deep/s2.txt", "axb is not a.b\n");
  mkdir_at("wd/.git");
  put("wd/.git/config", "a.b in git\n");
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/bin.dat", WD);
  FILE *f = fopen(p, "wb");
  fwrite("a.b\0", 1, 4, f);
  fclose(f);
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  /* A fixed string: "." is literal; .git, binaries and links skipped. */
  EXPECT_OK(reg, "search_text", "{\"pattern\": \"a.b\"}");
  cr_assert_str_eq(R.text,
                   "deep/s2.txt:1:axb is not a.b\ns1.txt:1:needle a.b here\n");
  EXPECT_OK(reg, "search_text",
            "{\"pattern\": \"a.b\", \"ignore_case\": true}");
  cr_assert_str_eq(R.text, "deep/s2.txt:1:axb is not a.b\ns1.txt:1:needle "
                           "a.b here\ns1.txt:3:A.B upper\n");
  EXPECT_OK(reg, "search_text",
            "{\"pattern\": \"^a.b\", \"regex\": true, \"path\": \"deep\"}");
  cr_assert_str_eq(R.text, "deep/s2.txt:1:axb is not a.b\n");
  EXPECT_OK(reg, "search_text",
            "{\"pattern\": \"no such text\", \"path\": \"s1.txt\"}");
  cr_assert_str_eq(R.text, "No matches for the text in s1.txt\n");
  /* Three matches at most in these tests. */
  put("wd/many.txt", "x1\nx2\nx3\nx4\nx5\n");
  EXPECT_OK(reg, "search_text", "{\"pattern\": \"x\", \"path\": \"many.txt\"}");
  cr_assert_str_eq(R.text, "many.txt:1:x1\nmany.txt:2:x2\nmany.txt:3:x3\n"
                           "[stopped at 3 matches; narrow the path or the "
                           "pattern]\n");
  EXPECT_ERR(reg, "search_text", "{\"pattern\": \"(\", \"regex\": true}",
             "invalid regular expression: missing closing parenthesis at "
             "offset 1");
  EXPECT_ERR(reg, "search_text", "{\"pattern\": \"x\", \"path\": \"nope\"}",
             "no such file or directory: nope");
  ag_registry_free(reg);
}

Test(builtin, search_text_catastrophic_pattern_stops) {
  /* test_schema.c's catastrophic case: 1999 a's and a b. */
  char line[2100];
  memset(line, 'a', 1999);
  strcpy(line + 1999, "b\n");
  put("wd/aaa.txt", "first line\n");
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/aaa.txt", WD);
  FILE *f = fopen(p, "a");
  fputs(line, f);
  fclose(f);
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, false, false);
  int64_t t0 = ag_now_ms();
  EXPECT_ERR(reg, "search_text",
             "{\"pattern\": \"^(a|a?)+\\\\1$\", \"regex\": true, "
             "\"path\": \"aaa.txt\"}",
             "too costly to match (PCRE2's match limit) at aaa.txt:2");
  cr_assert_lt(ag_now_ms() - t0, 2000);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* The escape corpus                                                        */
/* ------------------------------------------------------------------------ */

typedef struct attempt {
  const char *tool;
  const char *args;
  const char *why; /* expected in the error */
} attempt;

static const attempt k_corpus[] = {
    /* reads */
    {"read_file", "{\"path\": \"../secret.txt\"}", "escapes the workdir"},
    {"read_file", "{\"path\": \"/etc/passwd\"}", "absolute paths"},
    {"read_file", "{\"path\": \"//etc//passwd\"}", "absolute paths"},
    {"read_file", "{\"path\": \"/proc/self/root/etc/passwd\"}", "absolute"},
    {"read_file", "{\"path\": \"to_etc/passwd\"}", "escapes the workdir"},
    {"read_file", "{\"path\": \"to_secret\"}", "escapes the workdir"},
    {"read_file", "{\"path\": \"chain1\"}", "escapes the workdir"},
    {"read_file", "{\"path\": \"abs_secret\"}", "escapes the workdir"},
    {"read_file", "{\"path\": \"sub/up/secret.txt\"}", "escapes the workdir"},
    {"read_file", "{\"path\": \"dir_link/../../secret.txt\"}", "escapes"},
    {"read_file", "{\"path\": \"sub/../../secret.txt\"}", "escapes"},
    {"read_file", "{\"path\": \".//..//secret.txt\"}", "escapes"},
    {"read_file", "{\"path\": \"to_parent/secret.txt\"}", "escapes"},
    {"read_file", "{\"path\": \"../wd/a.txt/../../secret.txt\"}", "escapes"},
    {"read_file", "{\"path\": \"a.txt\\u0000/../../secret.txt\"}", "NUL"},
    {"read_file", "{\"path\": \"sub/up\", \"start_line\": 1}", "escapes"},
    /* writes */
    {"write_file", "{\"path\": \"../evil.txt\", \"content\": \"x\"}",
     "escapes"},
    {"write_file", "{\"path\": \"to_parent/evil.txt\", \"content\": \"x\"}",
     "escapes"},
    {"write_file", "{\"path\": \"dangling_out\", \"content\": \"x\"}",
     "escapes"},
    {"write_file", "{\"path\": \"to_secret\", \"content\": \"x\"}", "escapes"},
    {"write_file", "{\"path\": \"sub/up/evil.txt\", \"content\": \"x\"}",
     "escapes"},
    {"write_file", "{\"path\": \"made/../../evil.txt\", \"content\": \"x\"}",
     "escapes"},
    {"write_file", "{\"path\": \"sub/up/wd/../evil.txt\", \"content\": \"x\"}",
     "escapes"},
    {"write_file", "{\"path\": \"chain1\", \"content\": \"x\"}", "escapes"},
    {"edit_file",
     "{\"path\": \"to_secret\", \"old_string\": \"TOP\", \"new_string\": "
     "\"PWNED\"}",
     "escapes"},
    {"edit_file",
     "{\"path\": \"../secret.txt\", \"old_string\": \"TOP\", "
     "\"new_string\": \"PWNED\"}",
     "escapes"},
    /* listings and searches */
    {"list_dir", "{\"path\": \"..\"}", "escapes"},
    {"list_dir", "{\"path\": \"sub/../..\"}", "escapes"},
    {"list_dir", "{\"path\": \"to_etc\"}", "escapes"},
    {"list_dir", "{\"path\": \"to_parent/\"}", "escapes"},
    {"list_dir", "{\"path\": \"/\"}", "absolute"},
    {"search_text", "{\"pattern\": \"SECRET\", \"path\": \"..\"}", "escapes"},
    {"search_text", "{\"pattern\": \"SECRET\", \"path\": \"to_secret\"}",
     "escapes"},
    {"search_text", "{\"pattern\": \"root\", \"path\": \"to_etc\"}", "escapes"},
};
#define N_CORPUS (sizeof(k_corpus) / sizeof(k_corpus[0]))

/* Everything the corpus could have touched outside the workdir. */
static void assert_outside_untouched(const char *mode) {
  char *s = slurp("secret.txt");
  cr_assert_str_eq(s, SECRET "\n", "%s: the secret changed", mode);
  free(s);
  cr_assert_not(exists_at("evil.txt"), "%s: evil.txt was created", mode);
  cr_assert_not(exists_at("created_outside.txt"),
                "%s: created_outside.txt was created", mode);
  cr_assert_not(exists_at("abs_evil.txt"), "%s: abs_evil.txt was created",
                mode);
}

Test(builtin, escape_corpus_zero_escapes_both_resolvers) {
  cr_assert_geq(N_CORPUS, 20);
  /* Very long paths: past the 4095-byte limit, and one under it that climbs
   * out at the end; and an absolute path into the test's own directory (a
   * broken resolver must not write anywhere but there). */
  static char long_args[4][8192 + 64];
  char *p = long_args[0];
  p += sprintf(p, "{\"path\": \"");
  for (int i = 0; i < 2100; i++)
    p += sprintf(p, "a/");
  sprintf(p, "../secret.txt\"}");
  p = long_args[1];
  p += sprintf(p, "{\"path\": \"");
  for (int i = 0; i < 1000; i++)
    p += sprintf(p, "./");
  sprintf(p, "../secret.txt\"}");
  p = long_args[2];
  p += sprintf(p, "{\"path\": \"");
  for (int i = 0; i < 1000; i++)
    p += sprintf(p, "sub/../");
  sprintf(p, "..\"}");
  snprintf(long_args[3], sizeof(long_args[3]),
           "{\"path\": \"%s/abs_evil.txt\", \"content\": \"x\"}", T);

  for (size_t m = 0; m < 2; m++) {
    ag_registry *reg = make_reg(k_modes[m], false, false);
    size_t escapes = 0, refused = 0;
    for (size_t i = 0; i < N_CORPUS + 4; i++) {
      const char *tool = i < N_CORPUS        ? k_corpus[i].tool
                         : i == N_CORPUS + 2 ? "list_dir"
                         : i == N_CORPUS + 3 ? "write_file"
                                             : "read_file";
      const char *args =
          i < N_CORPUS ? k_corpus[i].args : long_args[i - N_CORPUS];
      call(reg, tool, args, &R);
      bool leaked = R.st == AG_TOOL_OK || strstr(R.text, SECRET) != NULL ||
                    strstr(R.text, "root:") != NULL;
      if (leaked) {
        escapes++;
        cr_log_error("%s: ESCAPE %s %.200s -> %s", k_mode_names[m], tool, args,
                     R.text);
        continue;
      }
      refused++;
      const char *why = i < N_CORPUS        ? k_corpus[i].why
                        : i == N_CORPUS     ? "path is too long"
                        : i == N_CORPUS + 1 ? "escapes"
                        : i == N_CORPUS + 2 ? "path is too long"
                                            : "absolute paths";
      cr_expect(strstr(R.text, why) != NULL,
                "%s: %s %.120s: expected \"%s\" in: %.300s", k_mode_names[m],
                tool, args, why, R.text);
    }
    cr_assert_eq(escapes, 0, "%s: %zu escapes", k_mode_names[m], escapes);
    cr_assert_eq(refused, N_CORPUS + 4);
    assert_outside_untouched(k_mode_names[m]);
    /* A search of the whole workdir never walks through a link out. */
    EXPECT_OK(reg, "search_text", "{\"pattern\": \"SECRET\"}");
    cr_assert_str_eq(R.text, "No matches for the text in .\n");
    EXPECT_OK(reg, "search_text", "{\"pattern\": \"root:\"}");
    cr_assert_str_eq(R.text, "No matches for the text in .\n");
    ag_registry_free(reg);
  }
}

Test(builtin, hard_link_to_outside_is_not_written) {
  char a[PATH_MAX * 2], b[PATH_MAX * 2];
  snprintf(a, sizeof(a), "%s/secret.txt", T);
  snprintf(b, sizeof(b), "%s/hard", WD);
  cr_assert_eq(link(a, b), 0, "%s", strerror(errno));
  for (size_t m = 0; m < 2; m++) {
    ag_registry *reg = make_reg(k_modes[m], false, false);
    EXPECT_ERR(reg, "write_file", "{\"path\": \"hard\", \"content\": \"x\"}",
               "hard has 2 hard links; refusing to write");
    EXPECT_ERR(reg, "edit_file",
               "{\"path\": \"hard\", \"old_string\": \"TOP\", "
               "\"new_string\": \"X\"}",
               "hard links");
    ag_registry_free(reg);
  }
  assert_outside_untouched("hard link");
}

/* The directory `race` is swapped, as fast as a thread can, with a symlink
 * to the parent of the workdir (renameat2 RENAME_EXCHANGE): a resolver that
 * checked first and opened later would read T/race/secret.txt. */
typedef struct racer {
  atomic_bool stop;
  int dirfd;
  atomic_long swaps;
} racer;

static void *race_thread(void *arg) {
  racer *r = arg;
  while (!atomic_load(&r->stop)) {
    if (renameat2(r->dirfd, "race", r->dirfd, "race_alt", RENAME_EXCHANGE) == 0)
      atomic_fetch_add(&r->swaps, 1);
  }
  return NULL;
}

Test(builtin, rename_race_never_escapes) {
  mkdir_at("race");
  put("race/secret.txt", SECRET " via race\n");
  mkdir_at("wd/race");
  put("wd/race/secret.txt", "inside\n");
  link_at("../race", "wd/race_alt");
  int dfd = open(WD, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cr_assert_geq(dfd, 0);
  for (size_t m = 0; m < 2; m++) {
    ag_registry *reg = make_reg(k_modes[m], false, false);
    racer r = {.dirfd = dfd};
    atomic_init(&r.stop, false);
    atomic_init(&r.swaps, 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, race_thread, &r), 0);
    int inside = 0, refused = 0, escapes = 0;
    /* 3000 reads at least, and on until the racer has swapped 100 times:
     * on a loaded machine its thread may not have run during the first
     * 3000 (10 s at most) */
    int64_t until = ag_now_ms() + 10000;
    for (int i = 0;
         i < 3000 || (atomic_load(&r.swaps) < 100 && ag_now_ms() < until);
         i++) {
      call(reg, "read_file", "{\"path\": \"race/secret.txt\"}", &R);
      if (strstr(R.text, SECRET) != NULL)
        escapes++;
      else if (R.st == AG_TOOL_OK)
        inside++;
      else
        refused++;
    }
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    long swaps = atomic_load(&r.swaps);
    cr_log_info("%s: %d inside, %d refused, %d escapes, %ld swaps",
                k_mode_names[m], inside, refused, escapes, swaps);
    cr_assert_eq(escapes, 0, "%s: %d escapes", k_mode_names[m], escapes);
    cr_assert_gt(swaps, 0);
    ag_registry_free(reg);
  }
  close(dfd);
}

/* ------------------------------------------------------------------------ */
/* run_command                                                              */
/* ------------------------------------------------------------------------ */

Test(builtin, run_command_in_workdir_statuses_and_errors) {
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, true, true);
  EXPECT_OK(reg, "run_command", "{\"command\": \"pwd -P; cat a.txt\"}");
  char real[PATH_MAX];
  cr_assert_not_null(realpath(WD, real));
  char want[PATH_MAX + 64];
  snprintf(want, sizeof(want), "%s\nalpha\nbeta\ngamma\n", real);
  cr_assert_str_eq(R.text, want);
  EXPECT_OK(reg, "run_command", "{\"argv\": [\"ls\", \"sub\"]}");
  cr_assert_str_eq(R.text, "b.txt\nup\n");
  EXPECT_OK(reg, "run_command", "{\"command\": \"true\"}");
  cr_assert_str_eq(R.text, "(exit status 0, no output)");
  EXPECT_OK(reg, "run_command", "{\"command\": \"echo out; echo err >&2\"}");
  cr_assert_str_eq(R.text, "out\n\n[stderr]\nerr\n");
  EXPECT_ERR(reg, "run_command",
             "{\"command\": \"echo partial; echo bad >&2; exit 3\"}",
             "command exited with status 3\n[stdout]\npartial\n\n[stderr]\n"
             "bad\n");
  EXPECT_ERR(reg, "run_command", "{\"argv\": [\"/no/such/program\"]}",
             "cannot run '/no/such/program': No such file or directory");
  EXPECT_ERR(reg, "run_command", "{}", "give exactly one of command");
  EXPECT_ERR(reg, "run_command",
             "{\"command\": \"true\", \"argv\": [\"true\"]}",
             "give exactly one of command");
  /* Output is capped per stream (4096 bytes in these tests). */
  EXPECT_OK(reg, "run_command",
            "{\"command\": \"head -c 100000 /dev/zero | "
            "tr '\\\\0' x\"}");
  cr_assert(strstr(R.text, "[output truncated:") != NULL, "%.100s", R.text);
  cr_assert_lt(strlen(R.text), 4200);
  ag_registry_free(reg);
}

Test(builtin, run_command_is_stopped_by_its_token) {
  ag_registry *reg = make_reg(AG_RESOLVE_AUTO, true, true);
  ag_cancel *c = NULL;
  cr_assert_eq(
      ag_cancel_new(&c, NULL, ag_now_ms() + 200, AG_CANCEL_TIMEOUT, NULL),
      AG_OK);
  int64_t t0 = ag_now_ms();
  call_c(reg, "run_command", "{\"command\": \"sleep 30\"}", c, &R);
  int64_t took = ag_now_ms() - t0;
  cr_assert_eq(R.st, AG_TOOL_TIMEOUT, "%d %s", R.st, R.text);
  cr_assert_lt(took, 5000, "took %lld ms", (long long)took);
  ag_cancel_free(c);
  ag_registry_free(reg);
}

/* Through the scheduler: run_command asks for approval unless `yes`. */
static int g_asked;
static ag_approval deny_all(void *user, const char *tool, const char *args,
                            size_t args_len, char *reason, size_t cap) {
  (void)user;
  (void)args;
  (void)args_len;
  g_asked++;
  snprintf(reason, cap, "not %s", tool);
  return AG_APPROVE_DENY;
}

Test(builtin, run_command_approval_through_the_scheduler) {
  ag_config cfg;
  ag_config_init(&cfg);
  for (int yes = 0; yes < 2; yes++) {
    ag_registry *reg = make_reg(AG_RESOLVE_AUTO, true, yes != 0);
    ag_scheduler_opts so;
    ag_scheduler_opts_init(&so);
    so.approve = deny_all;
    ag_scheduler *s = NULL;
    cr_assert_eq(ag_scheduler_new(&s, reg, &cfg, &so, NULL), AG_OK);
    const char *args = "{\"command\": \"echo ran\"}";
    const char *rargs = "{\"path\": \"a.txt\"}";
    ag_exec_call calls[2] = {{"run_command", args, strlen(args), false, NULL},
                             {"read_file", rargs, strlen(rargs), false, NULL}};
    ag_exec_result res[2];
    g_asked = 0;
    cr_assert_eq(ag_scheduler_run(s, calls, 2, NULL, res, NULL), AG_OK);
    if (yes) {
      cr_assert_eq(g_asked, 0);
      cr_assert_eq(res[0].status, AG_EXEC_OK, "%s", res[0].text);
      cr_assert_str_eq(res[0].text, "ran\n");
    } else {
      cr_assert_eq(g_asked, 1, "only run_command asks");
      cr_assert_eq(res[0].status, AG_EXEC_DENIED, "%s", res[0].text);
    }
    cr_assert_eq(res[1].status, AG_EXEC_OK);
    cr_assert_str_eq(res[1].text, "alpha\nbeta\ngamma\n");
    ag_exec_result_clear(&res[0]);
    ag_exec_result_clear(&res[1]);
    ag_scheduler_free(s);
    ag_registry_free(reg);
  }
}
