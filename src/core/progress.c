/*
 * src/core/progress.c - whether a call changes the world, from its tool's
 * name and its arguments alone (docs/detection.md, "Progress"). The guard
 * uses it to tell a loop from an edit-and-retest cycle: the same call
 * failing the same way again is new evidence when something was written
 * in between, and only a repeat when nothing was.
 *
 * The rule errs on the side of "changes": a tool not known to be
 * read-only, and a shell command not read-only by its effect, count as
 * changes, so that a healthy run is never taken for a loop; what is known
 * to only read (by the tool's name, an editor's "view" command, a shell
 * command made only of reading programs without a redirection) does not.
 *
 * Pure, allocation-free: the command is read from the arguments' JSON
 * text by a small scanner (or, in the guard, found by token in the tape
 * its signature has just made) into a fixed buffer (a longer one is judged
 * on its first COMMAND_MAX bytes, and a cut one counts as a change).
 */
#include <stdbool.h>
#include <string.h>

#include "internal.h"

#define COMMAND_MAX 2048

static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c + ('a' - 'A')) : c;
}

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether `name` (n bytes) is `word`, or starts with it followed by a
 * separator or an upper-case letter ("read_file", "read-file", "readFile"),
 * ASCII case-insensitively. */
static bool name_is(const char *name, size_t n, const char *word) {
  size_t wl = strlen(word);
  if (n < wl)
    return false;
  for (size_t i = 0; i < wl; i++)
    if (lower(name[i]) != word[i])
      return false;
  if (n == wl)
    return true;
  char c = name[wl];
  return c == '_' || c == '-' || c == '.' || (c >= 'A' && c <= 'Z');
}

static bool name_has(const char *name, size_t n, const char *part) {
  size_t pl = strlen(part);
  for (size_t i = 0; i + pl <= n; i++) {
    size_t k = 0;
    while (k < pl && lower(name[i + k]) == part[k])
      k++;
    if (k == pl)
      return true;
  }
  return false;
}

static bool name_in(const char *name, size_t n, const char *const *list) {
  char first = n > 0 ? lower(name[0]) : '\0';
  for (size_t i = 0; list[i] != NULL; i++)
    if (list[i][0] == first && name_is(name, n, list[i]))
      return true;
  return false;
}

/* Tools whose name says they only read. */
static const char *const read_tools[] = {
    "read",     "get",   "list",      "search", "find",    "view",   "show",
    "open",     "goto",  "scroll",    "grep",   "glob",    "ls",     "cat",
    "head",     "tail",  "fetch",     "query",  "lookup",  "look",   "inspect",
    "describe", "count", "calculate", "think",  "explore", "browse", NULL};

/* Tools that run a shell command (its text in "command", "cmd" or
 * "script"). */
static const char *const shell_tools[] = {"bash",
                                          "shell",
                                          "sh",
                                          "zsh",
                                          "execute_bash",
                                          "execute_command",
                                          "run_command",
                                          "run_shell_command",
                                          "run_terminal_cmd",
                                          "exec_command",
                                          "local_shell",
                                          "terminal",
                                          "powershell",
                                          "run",
                                          "exec",
                                          "cmd",
                                          NULL};

/* The closing quote of the string whose text starts at args[s] (n when
 * there is none): memchr to each quote, kept when an even number of
 * backslashes stands before it. Strings (an edit's text) are the bulk of
 * arguments: they are skipped at memchr's speed. */
static size_t string_end(const char *args, size_t n, size_t s) {
  for (size_t e = s; e < n;) {
    const char *q = memchr(args + e, '"', n - e);
    if (q == NULL)
      return n;
    e = (size_t)(q - args);
    size_t b = e;
    while (b > s && args[b - 1] == '\\')
      b--;
    if (((e - b) & 1) == 0)
      return e;
    e++;
  }
  return n;
}

/* Whether s[0..n) is one of `keys` (NULL-terminated). */
static bool key_in(const char *s, size_t n, const char *const *keys) {
  for (size_t i = 0; keys[i] != NULL; i++)
    if (strlen(keys[i]) == n && memcmp(s, keys[i], n) == 0)
      return true;
  return false;
}

/* The string content args[s..e) (escapes as written), unescaped (\n, \t,
 * \", \\, \/; other escapes kept as a mark) into out[0..cap): its length;
 * *cut when it did not fit. */
static long copy_unescaped(const char *args, size_t s, size_t e, char *out,
                           size_t cap, bool *cut) {
  size_t o = 0;
  for (size_t j = s; j < e; j++) {
    char v = args[j];
    if (v == '\\' && j + 1 < e) {
      char x = args[++j];
      v = x == 'n' ? '\n' : x == 't' ? '\t' : x == 'r' ? '\r' : x;
      if (x == 'u')
        v = '?'; /* an escaped code point: a character, not a separator */
    }
    if (o + 1 >= cap) {
      *cut = true;
      break;
    }
    out[o++] = v;
  }
  out[o] = '\0';
  return (long)o;
}

/* The string value of the first member named one of `keys` of the JSON
 * object text args[0..n), in one pass, unescaped into out[0..cap)
 * (copy_unescaped): its length, or -1 when there is none; *cut when it did
 * not fit. Only the object's top level is looked at. */
static long member_string(const char *args, size_t n, const char *const *keys,
                          char *out, size_t cap, bool *cut) {
  int depth = 0;
  *cut = false;
  for (size_t i = 0; i < n; i++) {
    char c = args[i];
    if (c == '{' || c == '[') {
      depth++;
      continue;
    }
    if (c == '}' || c == ']') {
      depth--;
      continue;
    }
    if (c != '"')
      continue;
    /* a string: a key of the top object when a ':' follows */
    size_t s = i + 1, e = string_end(args, n, s);
    if (e >= n)
      return -1;
    size_t j = e + 1;
    while (j < n && is_space(args[j]))
      j++;
    bool is_key = j < n && args[j] == ':';
    if (!is_key || depth != 1 || !key_in(args + s, e - s, keys)) {
      i = e;
      continue;
    }
    j++;
    while (j < n && is_space(args[j]))
      j++;
    if (j >= n || args[j] != '"')
      return -1; /* not a string */
    return copy_unescaped(args, j + 1, string_end(args, n, j + 1), out, cap,
                          cut);
  }
  return -1;
}

/* The same from the tape of the arguments (validated, no duplicate keys):
 * the top-level members are walked by token, not by byte. */
static long member_string_tape(const ag__jcs *j, const char *const *keys,
                               char *out, size_t cap, bool *cut) {
  *cut = false;
  if (ag__jcs_tok_type(j, 0) != AG__JT_OBJ)
    return -1;
  for (size_t i = 1, end = ag__jcs_tok_next(j, 0); i < end;
       i = ag__jcs_tok_next(j, i + 1)) {
    const char *k;
    size_t kn = ag__jcs_str_raw(j, i, &k);
    if (!key_in(k, kn, keys))
      continue;
    if (ag__jcs_tok_type(j, i + 1) != AG__JT_STR)
      return -1; /* not a string */
    const char *v;
    size_t vn = ag__jcs_str_raw(j, i + 1, &v);
    return copy_unescaped(v, 0, vn, out, cap, cut);
  }
  return -1;
}

/* Programs that only read (by their effect on files and state). */
static const char *const read_programs[] = {
    "ls",        "cat",      "head",    "tail",     "grep",     "egrep",
    "fgrep",     "rg",       "ag",      "find",     "pwd",      "echo",
    "printf",    "wc",       "sort",    "uniq",     "diff",     "cmp",
    "stat",      "file",     "which",   "whereis",  "type",     "env",
    "printenv",  "date",     "du",      "df",       "tree",     "less",
    "more",      "nl",       "cut",     "awk",      "sed",      "jq",
    "tr",        "basename", "dirname", "realpath", "readlink", "true",
    "false",     "test",     "[",       "id",       "whoami",   "uname",
    "hostname",  "ps",       "history", "man",      "cd",       "sleep",
    "column",    "xxd",      "od",      "hexdump",  "strings",  "md5sum",
    "sha256sum", "tac",      "rev",     "fold",     "paste",    "join",
    "comm",      "seq",      NULL};

/* git subcommands that only read. */
static const char *const git_reads[] = {
    "status", "diff",     "log",       "show",     "blame",
    "grep",   "ls-files", "rev-parse", "describe", "shortlog",
    "reflog", "ls-tree",  "cat-file",  NULL};

static bool word_in(const char *w, size_t n, const char *const *list) {
  if (n == 0)
    return false;
  for (size_t i = 0; list[i] != NULL; i++)
    if (list[i][0] == w[0] && strlen(list[i]) == n &&
        memcmp(w, list[i], n) == 0)
      return true;
  return false;
}

/* The next word of s[*i..n) (spaces skipped): its start and length. */
static size_t next_word(const char *s, size_t n, size_t *i, size_t *len) {
  while (*i < n && is_space(s[*i]))
    (*i)++;
  size_t st = *i;
  while (*i < n && !is_space(s[*i]))
    (*i)++;
  *len = *i - st;
  return st;
}

/* Whether `w` (n bytes) is a python interpreter ("python", "python3",
 * "/usr/bin/python3.11"). */
static bool is_python(const char *w, size_t n) {
  const char *slash = NULL;
  for (size_t i = 0; i < n; i++)
    if (w[i] == '/')
      slash = w + i;
  size_t off = slash != NULL ? (size_t)(slash - w) + 1 : 0;
  return n - off >= 6 && memcmp(w + off, "python", 6) == 0;
}

static const char *const test_runners[] = {"pytest", "tox", "nosetests",
                                           "nose2", NULL};
static const char *const builders[] = {
    "mvn",   "./mvnw", "mvnw", "gradle", "./gradlew", "gradlew", "go",
    "cargo", "npm",    "yarn", "pnpm",   "make",      "ctest",   NULL};
static const char *const build_tests[] = {"test", "check", "verify", NULL};
static const char *const python_tests[] = {"pytest", "unittest", NULL};

/* Whether a command runs a test suite (by effect it reads: a test run
 * between two others is no edit): a test runner, a build tool's test
 * goal, python -m pytest / unittest, a runtests script. */
static bool runs_tests(const char *s, size_t n) {
  size_t i = 0, l;
  size_t st = next_word(s, n, &i, &l);
  const char *first = s + st;
  if (word_in(first, l, test_runners) || name_has(first, l, "runtests") ||
      (memchr(first, '/', l) != NULL && name_has(first, l, "test")))
    return true;
  bool builder = word_in(first, l, builders), python = is_python(first, l);
  while (builder || python) {
    size_t ws = next_word(s, n, &i, &l);
    if (l == 0)
      return false;
    if (builder && word_in(s + ws, l, build_tests))
      return true;
    if (python && l == 2 && memcmp(s + ws, "-m", 2) == 0) {
      size_t ms = next_word(s, n, &i, &l);
      return word_in(s + ms, l, python_tests);
    }
  }
  return false;
}

/* Whether s[0..n) redirects output into a file (2>&1, >&2, &> and
 * /dev/null aside). */
static bool has_write_redirect(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '>')
      continue;
    size_t j = i + 1;
    if (j < n && s[j] == '>')
      j++;
    if (j < n && s[j] == '&')
      continue;
    while (j < n && is_space(s[j]))
      j++;
    if (n - j >= 9 && memcmp(s + j, "/dev/null", 9) == 0)
      continue;
    return true;
  }
  return false;
}

/* Whether one simple command (no separators) only reads. */
static bool reads_only(const char *s, size_t n) {
  if (has_write_redirect(s, n))
    return false;
  size_t i = 0, l;
  size_t st = next_word(s, n, &i, &l);
  /* prefixes that run the rest: env assignments, sudo, timeout N, time */
  for (;;) {
    if (l == 0)
      return true; /* nothing to run */
    bool assign = memchr(s + st, '=', l) != NULL && s[st] != '-';
    if (assign || word_in(s + st, l,
                          (const char *const[]){"sudo", "time", "nice",
                                                "command", "builtin", NULL})) {
      st = next_word(s, n, &i, &l);
      continue;
    }
    if (l == 7 && memcmp(s + st, "timeout", 7) == 0) {
      next_word(s, n, &i, &l); /* its duration */
      st = next_word(s, n, &i, &l);
      continue;
    }
    break;
  }
  const char *prog = s + st;
  size_t pl = l;
  if (runs_tests(prog, n - st))
    return true;
  if (pl == 3 && memcmp(prog, "git", 3) == 0) {
    size_t gs = next_word(s, n, &i, &l);
    while (l > 0 && s[gs] == '-') /* git -C dir, --no-pager */
      gs = next_word(s, n, &i, &l);
    return word_in(s + gs, l, git_reads);
  }
  if (!word_in(prog, pl, read_programs))
    return false;
  /* reading programs that write with an option */
  for (size_t k = i; k + 1 < n; k++) {
    if (s[k] != '-' || (k > 0 && !is_space(s[k - 1])))
      continue;
    if ((pl == 3 && memcmp(prog, "sed", 3) == 0 && s[k + 1] == 'i') ||
        (pl == 4 && memcmp(prog, "find", 4) == 0 && k + 6 < n &&
         (memcmp(s + k, "-delete", 7) == 0 || memcmp(s + k, "-exec", 5) == 0)))
      return false;
    if (pl == 3 && memcmp(prog, "awk", 3) == 0 && k + 2 < n &&
        memcmp(s + k, "-i", 2) == 0)
      return false;
  }
  return true;
}

/* Whether a whole shell command only reads: every simple command in it
 * (split at ;, newlines, | and &, but not at the & of 2>&1 or &>). A
 * pipe into tee writes: tee is no reading program. */
static bool command_reads_only(const char *s, size_t n) {
  size_t st = 0;
  for (size_t i = 0; i <= n; i++) {
    bool sep = i == n || s[i] == ';' || s[i] == '\n' || s[i] == '|';
    if (i < n && s[i] == '&')
      sep = !(i > 0 && s[i - 1] == '>') && !(i + 1 < n && s[i + 1] == '>');
    if (!sep)
      continue;
    if (!reads_only(s + st, i - st))
      return false;
    st = i + 1;
  }
  return true;
}

ag__tool_kind ag__tool_kind_of(const char *name, size_t name_len) {
  if (name_in(name, name_len, read_tools))
    return AG__TOOL_READS;
  if (name_in(name, name_len, shell_tools))
    return AG__TOOL_SHELL;
  /* str_replace_editor, str_replace_based_edit_tool, text_editor, Edit */
  if (name_has(name, name_len, "edit") ||
      name_has(name, name_len, "str_replace"))
    return AG__TOOL_EDITOR;
  return AG__TOOL_OTHER;
}

/* Where a shell tool's command is, and an editor's. */
static const char *const shell_keys[] = {"command", "cmd", "script", NULL};
static const char *const editor_keys[] = {"command", NULL};

bool ag__args_change_state(ag__tool_kind kind, const char *args,
                           size_t args_len, const ag__jcs *tape) {
  char cmd[COMMAND_MAX];
  bool cut = false;
  long cl;
  switch (kind) {
  case AG__TOOL_READS:
    return false;
  case AG__TOOL_SHELL:
    cl = tape != NULL
             ? member_string_tape(tape, shell_keys, cmd, sizeof cmd, &cut)
             : member_string(args, args_len, shell_keys, cmd, sizeof cmd, &cut);
    return cl < 0 || cut || !command_reads_only(cmd, (size_t)cl);
  case AG__TOOL_EDITOR: /* "view" reads, every other command writes */
    cl =
        tape != NULL
            ? member_string_tape(tape, editor_keys, cmd, sizeof cmd, &cut)
            : member_string(args, args_len, editor_keys, cmd, sizeof cmd, &cut);
    return !(cl == 4 && memcmp(cmd, "view", 4) == 0);
  case AG__TOOL_UNSEEN: /* the caller looks at the name first */
  case AG__TOOL_OTHER:
    break;
  }
  return true; /* not known to be read-only */
}

bool ag__call_changes_state(const char *name, size_t name_len, const char *args,
                            size_t args_len) {
  return ag__args_change_state(ag__tool_kind_of(name, name_len), args, args_len,
                               NULL);
}
