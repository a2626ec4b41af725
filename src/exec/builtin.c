/*
 * src/exec/builtin.c - the built-in tools of `agentguard run`: read_file,
 * write_file, edit_file, list_dir, search_text and run_command, confined to
 * a workdir (docs/tools.md, "Built-in tools").
 *
 * Every tool is a native tool over one shared, read-only state (the
 * workdir's descriptor and the caps), owned by the registry
 * (ag__registry_own) so it lives exactly as long as the tools. Paths go
 * through workdir.c; a tool never calls open() on a path of its own.
 *
 * Files are opened with O_NONBLOCK and checked with fstat to be regular
 * files before a byte is read or written, so a FIFO or a device inside the
 * workdir can neither block a tool nor be written to. Writes refuse a file
 * with more than one hard link: a hard link inside the workdir to a file
 * outside is the same file, and path confinement cannot tell. Files with a
 * NUL byte are binary: read_file and edit_file refuse them, search_text
 * skips them.
 *
 * Caps (every one a number in ag_builtin_opts): a file read whole is at most
 * max_read_bytes, and a line range's text too (the file itself may be
 * larger: a range streams through it); write_file's content and
 * edit_file's result are at most max_write_bytes; list_dir shows at most
 * max_list_entries names (the first in byte order, and how many more there
 * are); search_text reports at most max_matches lines, skips files larger
 * than max_search_bytes and directories nested deeper than MAX_SEARCH_DEPTH,
 * and cuts each line to MAX_LINE_SHOWN bytes; run_command keeps
 * max_output bytes of each stream. Errors are permanent (never retried) and
 * say what to do next ("file is larger than 256 KiB (300000 bytes): read a
 * line range with start_line and end_line").
 *
 * edit_file writes in place: the bytes before the match stay, the rest is
 * rewritten and the file cut to its new length, so the file keeps its
 * inode, owner, mode and links. Rejected: a temporary file renamed over it
 * (atomic, but it would replace a symlink inside the workdir by a regular
 * file and lose the owner); a disk that fills mid-write can therefore leave
 * the tail cut short, and the error says the write failed.
 *
 * search_text matches with PCRE2 (fixed strings with PCRE2_LITERAL), in UTF
 * mode that tolerates invalid UTF-8 (PCRE2_MATCH_INVALID_UTF), under the
 * match, depth and heap limits schema.c uses for `pattern`, so a
 * catastrophic pattern stops with an error within milliseconds per line.
 * It never follows a symlink while walking (a symlink is skipped; one given
 * as the path itself is resolved inside the workdir like any path), and
 * skips .git directories.
 *
 * run_command is a subprocess (ag__subprocess_run_in with the workdir as its
 * working directory): the attempt token brings the timeout and the turn's
 * cancellation, the group gets SIGTERM then SIGKILL. It is not confined:
 * the command can reach anything the user can; the workdir is only where
 * it starts. Hence off by default, approval by default, no retries.
 *
 * Threading: the state is only read after registration; every call uses
 * its own descriptors and buffers, so calls run on any pool threads at once.
 */
#define _GNU_SOURCE /* memmem, O_PATH, fdopendir */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "internal.h"

#define KIB ((size_t)1024)
#define DEF_READ (256 * KIB)
#define DEF_WRITE (1024 * KIB)
#define SHOWN_PATH 200 /* bytes of a path in a message */
#define DEF_ENTRIES 1000
#define DEF_MATCHES 200
#define DEF_SEARCH (1024 * KIB)
#define DEF_CMD_OUTPUT (64 * KIB)
#define MAX_SEARCH_DEPTH 32
#define MAX_DIR_NAMES                                                          \
  100000                   /* names read from one directory when searching     \
                            */
#define MAX_LINE_SHOWN 300 /* bytes of a matching line shown */
#define MAX_ARGV 256
#define MAX_COMMAND (64 * KIB)
#define MAX_PATTERN 1000
#define KILL_GRACE_MS 500  /* run_command: SIGTERM, then SIGKILL after this */
#define MAX_SHOWN_LINES 10 /* line numbers listed for "occurs N times" */
#define MSG 1024
/* The same limits as schema.c's `pattern` matches (its note has the
 * figures): a match that reaches one stops within milliseconds. */
#define MATCH_LIMIT 200000u
#define MATCH_DEPTH 100000u
#define MATCH_HEAP_KIB 8192u

typedef struct builtin {
  ag__wd wd;
  size_t max_read, max_write, max_entries, max_matches, max_search, max_output;
  char *shell;
} builtin;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static ag_tool_status fail(ag_output *out, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static ag_tool_status fail(ag_output *out, const char *fmt, ...) {
  char buf[MSG];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  ag_output_write(out, buf, strlen(buf));
  ag_output_set_transient(out, false);
  return AG_TOOL_ERROR;
}

/* A size as "256 KiB", "1 MiB" or "300 bytes". */
static const char *size_text(size_t n, char *buf, size_t cap) {
  if (n >= 1024 * KIB && n % (1024 * KIB) == 0)
    snprintf(buf, cap, "%zu MiB", n / (1024 * KIB));
  else if (n >= KIB && n % KIB == 0)
    snprintf(buf, cap, "%zu KiB", n / KIB);
  else
    snprintf(buf, cap, "%zu bytes", n);
  return buf;
}

/* strerror for any thread (glibc's strerror may use a shared buffer for
 * unknown codes); the text lives until the thread's next call. */
static const char *etext(int e) {
  static _Thread_local char buf[128];
  return strerror_r(e, buf, sizeof(buf)); /* GNU: returns the text */
}

static bool cancelled(ag_cancel *c) {
  return c != NULL && ag_cancel_check(c, ag_now_ms()) != AG_CANCEL_NONE;
}

/* The string argument `key` (schema-checked to be a string when present);
 * NULL when absent. A NUL inside is an error. */
static int get_str(const json_t *args, const char *key, const char **s,
                   size_t *len, ag_output *out) {
  json_t *v = json_object_get(args, key);
  *s = NULL;
  if (len != NULL)
    *len = 0;
  if (v == NULL)
    return 0;
  if (!json_is_string(v)) {
    fail(out, "%s: expected a string", key);
    return -1;
  }
  *s = json_string_value(v);
  size_t n = json_string_length(v);
  if (len != NULL)
    *len = n;
  if (strlen(*s) != n) {
    fail(out, "%s contains a NUL byte", key);
    return -1;
  }
  return 0;
}

static int get_path(const json_t *args, const char *key, const char *dflt,
                    const char **path, ag_output *out) {
  if (get_str(args, key, path, NULL, out) != 0)
    return -1;
  if (*path == NULL)
    *path = dflt;
  if (*path == NULL || (*path)[0] == '\0') {
    fail(out, "%s is empty; give a path relative to the workdir", key);
    return -1;
  }
  return 0;
}

/* Opens a regular file beneath the workdir (O_NONBLOCK: a FIFO never
 * blocks the open). -1 after writing the error. */
static int open_regular(const builtin *b, const char *path, int flags,
                        struct stat *st, ag_output *out) {
  char msg[MSG];
  int fd =
      ag__wd_open(&b->wd, path, flags | O_NONBLOCK, 0666, msg, sizeof(msg));
  if (fd < 0) {
    fail(out, "%s", msg);
    return -1;
  }
  if (fstat(fd, st) != 0) {
    char p[256];
    fail(out, "cannot stat %s: %s", ag__shown(path, SHOWN_PATH, p, sizeof(p)),
         etext(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    char p[256];
    fail(out, "%s %s", ag__shown(path, SHOWN_PATH, p, sizeof(p)),
         S_ISDIR(st->st_mode) ? "is a directory; use list_dir"
                              : "is not a regular file");
    close(fd);
    return -1;
  }
  /* Reads and writes below wait on regular files only, but go back to
   * blocking mode so a short count means what it says. */
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

/* Reads at most cap + 1 bytes (to tell "larger than cap"). Returns the
 * buffer (malloc'd, NUL-terminated) or NULL with the error written. */
static char *read_capped(int fd, size_t cap, size_t *len, const char *path,
                         ag_cancel *cancel, ag_output *out) {
  size_t want = cap + 1, have = 0, size = 64 * KIB < want ? 64 * KIB : want;
  char *buf = malloc(size + 1);
  if (buf == NULL) {
    fail(out, "out of memory");
    return NULL;
  }
  for (;;) {
    if (have == size && size < want) {
      size_t ns = size * 2 < want ? size * 2 : want;
      char *nb = realloc(buf, ns + 1);
      if (nb == NULL) {
        free(buf);
        fail(out, "out of memory");
        return NULL;
      }
      buf = nb;
      size = ns;
    }
    if (have == size)
      break;
    ssize_t n = read(fd, buf + have, size - have);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      char p[256];
      fail(out, "cannot read %s: %s", ag__shown(path, SHOWN_PATH, p, sizeof(p)),
           etext(errno));
      free(buf);
      return NULL;
    }
    if (n == 0)
      break;
    have += (size_t)n;
    if (cancelled(cancel)) {
      free(buf);
      return NULL;
    }
  }
  buf[have] = '\0';
  *len = have;
  return buf;
}

static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return -1;
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

/* 1-based line number of byte offset `off`. */
static size_t line_of(const char *s, size_t off) {
  size_t line = 1;
  for (size_t i = 0; i < off; i++)
    line += s[i] == '\n';
  return line;
}

/* ------------------------------------------------------------------------ */
/* read_file                                                                */
/* ------------------------------------------------------------------------ */

static const char k_read_desc[] =
    "Read a text file in the workdir. Returns the file's contents as they "
    "are. For a large file give start_line and/or end_line (1-based, "
    "inclusive) to read a range of lines. Paths are relative to the "
    "workdir.";
static const char k_read_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":"
    "\"File path relative to the workdir\"},"
    "\"start_line\":{\"type\":\"integer\",\"minimum\":1,\"description\":"
    "\"First line to read (1-based); default 1\"},"
    "\"end_line\":{\"type\":\"integer\",\"minimum\":1,\"description\":"
    "\"Last line to read (inclusive); default the last line\"}},"
    "\"required\":[\"path\"],\"additionalProperties\":false}";

static ag_tool_status read_range(const builtin *b, int fd, const char *path,
                                 size_t first, size_t last, ag_cancel *cancel,
                                 ag_output *out) {
  char p[256], sz[32];
  char chunk[16 * 1024];
  size_t line = 1, kept = 0;
  bool any = false, at_line_start = true;
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return fail(out, "cannot read %s: %s",
                  ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(errno));
    if (n == 0)
      break;
    if (memchr(chunk, '\0', (size_t)n) != NULL)
      return fail(out,
                  "%s looks like a binary file (it has NUL bytes); "
                  "read_file reads text",
                  ag__shown(path, SHOWN_PATH, p, sizeof(p)));
    size_t i = 0;
    while (i < (size_t)n && line <= last) {
      char *nl = memchr(chunk + i, '\n', (size_t)n - i);
      size_t end = nl != NULL ? (size_t)(nl - chunk) + 1 : (size_t)n;
      if (line >= first) {
        size_t len = end - i;
        if (kept + len > b->max_read)
          return fail(out,
                      "lines %zu-%zu of %s are more than %s; read a "
                      "smaller range",
                      first, last, ag__shown(path, SHOWN_PATH, p, sizeof(p)),
                      size_text(b->max_read, sz, sizeof(sz)));
        ag_output_write(out, chunk + i, len);
        kept += len;
        any = true;
      }
      at_line_start = nl != NULL;
      if (nl != NULL)
        line++;
      i = end;
    }
    if (line > last)
      break;
    if (cancelled(cancel))
      return AG_TOOL_CANCELLED;
  }
  /* `line` counts started lines; a file not ending in '\n' has one more. */
  size_t lines = at_line_start ? line - 1 : line;
  if (!any && first > lines)
    return fail(out, "start_line %zu is past the end of %s (%zu lines)", first,
                ag__shown(path, SHOWN_PATH, p, sizeof(p)), lines);
  return AG_TOOL_OK;
}

static ag_tool_status tool_read(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  const builtin *b = user;
  const char *path;
  if (get_path(args, "path", NULL, &path, out) != 0)
    return AG_TOOL_ERROR;
  json_t *js = json_object_get(args, "start_line");
  json_t *je = json_object_get(args, "end_line");
  bool ranged = js != NULL || je != NULL;
  json_int_t first = js != NULL ? json_integer_value(js) : 1;
  json_int_t last = je != NULL ? json_integer_value(je) : INT64_MAX;
  if (first < 1 || last < 1)
    return fail(out, "start_line and end_line are 1-based");
  if (last < first)
    return fail(out, "end_line %lld is before start_line %lld", (long long)last,
                (long long)first);

  struct stat st;
  int fd = open_regular(b, path, O_RDONLY, &st, out);
  if (fd < 0)
    return AG_TOOL_ERROR;
  char p[256], sz[32];
  ag_tool_status rc;
  if (ranged) {
    rc = read_range(b, fd, path, (size_t)first,
                    last > (json_int_t)(SIZE_MAX / 2) ? SIZE_MAX / 2
                                                      : (size_t)last,
                    cancel, out);
    close(fd);
    return rc;
  }
  if ((uint64_t)st.st_size > b->max_read) {
    close(fd);
    return fail(out,
                "%s is larger than %s (%lld bytes); read a line range with "
                "start_line and end_line",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)),
                size_text(b->max_read, sz, sizeof(sz)), (long long)st.st_size);
  }
  size_t len = 0;
  char *data = read_capped(fd, b->max_read, &len, path, cancel, out);
  close(fd);
  if (data == NULL)
    return cancelled(cancel) ? AG_TOOL_CANCELLED : AG_TOOL_ERROR;
  if (len > b->max_read) {
    free(data);
    return fail(out,
                "%s is larger than %s; read a line range with start_line and "
                "end_line",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)),
                size_text(b->max_read, sz, sizeof(sz)));
  }
  if (memchr(data, '\0', len) != NULL) {
    free(data);
    return fail(out,
                "%s looks like a binary file (it has NUL bytes); read_file "
                "reads text",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)));
  }
  ag_output_write(out, data, len);
  free(data);
  return AG_TOOL_OK;
}

/* ------------------------------------------------------------------------ */
/* write_file                                                               */
/* ------------------------------------------------------------------------ */

static const char k_write_desc[] =
    "Write a text file in the workdir, replacing it if it exists. Missing "
    "parent directories are created (inside the workdir only). Give the "
    "complete new contents. To change part of an existing file prefer "
    "edit_file.";
static const char k_write_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":"
    "\"File path relative to the workdir\"},"
    "\"content\":{\"type\":\"string\",\"description\":"
    "\"The complete contents to write\"}},"
    "\"required\":[\"path\",\"content\"],\"additionalProperties\":false}";

/* Refuses a file with several hard links (the note at the top). */
static bool hard_linked(const struct stat *st, const char *path,
                        ag_output *out) {
  if (st->st_nlink <= 1)
    return false;
  char p[256];
  fail(out,
       "%s has %ju hard links; refusing to write through a hard link (it "
       "may be a file outside the workdir)",
       ag__shown(path, SHOWN_PATH, p, sizeof(p)), (uintmax_t)st->st_nlink);
  return true;
}

static ag_tool_status tool_write(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)cancel;
  const builtin *b = user;
  const char *path, *content;
  size_t clen;
  char p[256], sz[32], msg[MSG];
  if (get_path(args, "path", NULL, &path, out) != 0 ||
      get_str(args, "content", &content, &clen, out) != 0)
    return AG_TOOL_ERROR;
  if (content == NULL)
    return fail(out, "content is missing");
  if (clen > b->max_write)
    return fail(out, "content is %zu bytes; write_file writes at most %s", clen,
                size_text(b->max_write, sz, sizeof(sz)));
  size_t n = strlen(path);
  const char *slash = strrchr(path, '/');
  const char *base = slash != NULL ? slash + 1 : path;
  if (base[0] == '\0' || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
    return fail(out, "%s names a directory; give a file name",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)));
  if (n > AG__WD_PATH_MAX || path[0] == '/') {
    ag__wd_open(&b->wd, path, O_RDONLY, 0, msg, sizeof(msg));
    return fail(out, "%s", msg);
  }
  if (slash != NULL) {
    char *dir = ag__strndup(path, (size_t)(slash - path));
    if (dir == NULL)
      return fail(out, "out of memory");
    int r = ag__wd_mkdirs(&b->wd, dir, msg, sizeof(msg));
    int e = errno;
    free(dir);
    if (r != 0 && e == EXDEV)
      return fail(out, "path escapes the workdir: %s",
                  ag__shown(path, SHOWN_PATH, p, sizeof(p)));
    if (r != 0)
      return fail(out, "%s", msg);
  }
  bool created = true;
  int fd = ag__wd_open(&b->wd, path, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK,
                       0666, msg, sizeof(msg));
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = ag__wd_open(&b->wd, path, O_WRONLY | O_CREAT | O_NONBLOCK, 0666, msg,
                     sizeof(msg));
  }
  if (fd < 0)
    return fail(out, "%s", msg);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return fail(out, "%s is not a regular file",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)));
  }
  if (hard_linked(&st, path, out)) {
    close(fd);
    return AG_TOOL_ERROR;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (ftruncate(fd, 0) != 0 || write_all(fd, content, clen) != 0) {
    int e = errno;
    close(fd);
    return fail(out, "cannot write %s: %s",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(e));
  }
  if (close(fd) != 0)
    return fail(out, "cannot write %s: %s",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(errno));
  ag_output_printf(out, "%s %s (%zu bytes)", created ? "Created" : "Wrote",
                   ag__shown(path, SHOWN_PATH, p, sizeof(p)), clen);
  return AG_TOOL_OK;
}

/* ------------------------------------------------------------------------ */
/* edit_file                                                                */
/* ------------------------------------------------------------------------ */

static const char k_edit_desc[] =
    "Edit a text file in the workdir by replacing one exact piece of text. "
    "old_string must occur exactly once in the file: copy it exactly, "
    "whitespace and line breaks included, with enough surrounding lines to "
    "make it unique. It is replaced by new_string.";
static const char k_edit_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":"
    "\"File path relative to the workdir\"},"
    "\"old_string\":{\"type\":\"string\",\"minLength\":1,\"description\":"
    "\"The exact text to replace; must occur exactly once\"},"
    "\"new_string\":{\"type\":\"string\",\"description\":"
    "\"The replacement text\"}},"
    "\"required\":[\"path\",\"old_string\",\"new_string\"],"
    "\"additionalProperties\":false}";

static ag_tool_status tool_edit(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  const builtin *b = user;
  const char *path, *olds, *news;
  size_t olen, nlen;
  char p[256], sz[32];
  if (get_path(args, "path", NULL, &path, out) != 0 ||
      get_str(args, "old_string", &olds, &olen, out) != 0 ||
      get_str(args, "new_string", &news, &nlen, out) != 0)
    return AG_TOOL_ERROR;
  if (olds == NULL || news == NULL)
    return fail(out, "old_string and new_string are required");
  if (olen == 0)
    return fail(out, "old_string is empty; give the exact text to replace");
  if (olen == nlen && memcmp(olds, news, olen) == 0)
    return fail(out, "old_string and new_string are the same; nothing to "
                     "change");

  struct stat st;
  int fd = open_regular(b, path, O_RDWR, &st, out);
  if (fd < 0)
    return AG_TOOL_ERROR;
  if (hard_linked(&st, path, out)) {
    close(fd);
    return AG_TOOL_ERROR;
  }
  if ((uint64_t)st.st_size > b->max_read) {
    close(fd);
    return fail(out,
                "%s is larger than %s (%lld bytes); edit_file edits "
                "files up to that size",
                ag__shown(path, SHOWN_PATH, p, sizeof(p)),
                size_text(b->max_read, sz, sizeof(sz)), (long long)st.st_size);
  }
  size_t len = 0;
  char *data = read_capped(fd, b->max_read, &len, path, cancel, out);
  if (data == NULL) {
    close(fd);
    return cancelled(cancel) ? AG_TOOL_CANCELLED : AG_TOOL_ERROR;
  }
  ag_tool_status rc = AG_TOOL_OK;
  if (len > b->max_read || memchr(data, '\0', len) != NULL) {
    rc = fail(out, "%s %s", ag__shown(path, SHOWN_PATH, p, sizeof(p)),
              len > b->max_read
                  ? "grew past the read limit while being read"
                  : "looks like a binary file (it has NUL bytes); edit_file "
                    "edits text");
    goto done;
  }
  /* Count the occurrences (non-overlapping) and note their lines. */
  size_t count = 0, first = 0;
  size_t lines[MAX_SHOWN_LINES];
  for (const char *at = data; at < data + len;) {
    const char *hit = memmem(at, (size_t)(data + len - at), olds, olen);
    if (hit == NULL)
      break;
    if (count == 0)
      first = (size_t)(hit - data);
    if (count < MAX_SHOWN_LINES)
      lines[count] = line_of(data, (size_t)(hit - data));
    count++;
    at = hit + olen;
  }
  if (count == 0) {
    rc = fail(out,
              "old_string not found in %s; read the file again and copy the "
              "text exactly (whitespace and line breaks included)",
              ag__shown(path, SHOWN_PATH, p, sizeof(p)));
    goto done;
  }
  if (count > 1) {
    char where[160] = "";
    size_t used = 0;
    for (size_t i = 0; i < count && i < MAX_SHOWN_LINES; i++)
      used += (size_t)snprintf(where + used, sizeof(where) - used, "%s%zu",
                               i ? ", " : "", lines[i]);
    rc = fail(out,
              "old_string occurs %zu times in %s (lines %s%s); include more "
              "surrounding text so that it occurs exactly once",
              count, ag__shown(path, SHOWN_PATH, p, sizeof(p)), where,
              count > MAX_SHOWN_LINES ? ", ..." : "");
    goto done;
  }
  size_t rlen = len - olen + nlen;
  if (rlen > b->max_write) {
    rc = fail(out, "the edited file would be %zu bytes; at most %s", rlen,
              size_text(b->max_write, sz, sizeof(sz)));
    goto done;
  }
  if (cancelled(cancel)) {
    rc = AG_TOOL_CANCELLED;
    goto done;
  }
  /* Write the tail from the edit onwards in place, then cut what is left:
   * the bytes before the match are already on disk. */
  if (lseek(fd, (off_t)first, SEEK_SET) < 0 || write_all(fd, news, nlen) ||
      write_all(fd, data + first + olen, len - first - olen) ||
      ftruncate(fd, (off_t)rlen) != 0) {
    rc = fail(out, "cannot write %s: %s",
              ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(errno));
    goto done;
  }
  ag_output_printf(out, "Edited %s: replaced 1 occurrence at line %zu",
                   ag__shown(path, SHOWN_PATH, p, sizeof(p)), lines[0]);
done:
  free(data);
  if (close(fd) != 0 && rc == AG_TOOL_OK)
    rc = fail(out, "cannot write %s: %s",
              ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(errno));
  return rc;
}

/* ------------------------------------------------------------------------ */
/* list_dir                                                                 */
/* ------------------------------------------------------------------------ */

static const char k_list_desc[] =
    "List a directory in the workdir, sorted by name. Directories end in "
    "'/', symbolic links in '@'. path defaults to the workdir itself (\".\").";
static const char k_list_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":"
    "\"Directory path relative to the workdir; default \\\".\\\"\"}},"
    "\"additionalProperties\":false}";

/* The `cap` smallest names seen, sorted (binary insertion). */
typedef struct names {
  char **v;
  size_t n, cap;
  size_t total;
} names;

static int names_add(names *ns, const char *name, char suffix) {
  ns->total++;
  size_t len = strlen(name);
  size_t lo = 0, hi = ns->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (strcmp(ns->v[mid], name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo >= ns->cap)
    return 0; /* larger than every name kept */
  char *copy = malloc(len + 2);
  if (copy == NULL)
    return -1;
  memcpy(copy, name, len);
  copy[len] = suffix;
  copy[len + (suffix != '\0')] = '\0';
  if (ns->n == ns->cap)
    free(ns->v[--ns->n]);
  memmove(ns->v + lo + 1, ns->v + lo, (ns->n - lo) * sizeof(*ns->v));
  ns->v[lo] = copy;
  ns->n++;
  return 0;
}

static void names_free(names *ns) {
  for (size_t i = 0; i < ns->n; i++)
    free(ns->v[i]);
  free(ns->v);
}

/* d_type, or fstatat's answer when the file system does not say. */
static unsigned char entry_type(int dfd, const struct dirent *d) {
  if (d->d_type != DT_UNKNOWN)
    return d->d_type;
  struct stat st;
  if (fstatat(dfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return DT_UNKNOWN;
  return S_ISDIR(st.st_mode)   ? DT_DIR
         : S_ISLNK(st.st_mode) ? DT_LNK
         : S_ISREG(st.st_mode) ? DT_REG
                               : DT_UNKNOWN;
}

/* Opens a directory beneath the workdir as a DIR stream; NULL after writing
 * the error. */
static DIR *open_dir(const builtin *b, const char *path, ag_output *out) {
  char msg[MSG];
  int fd =
      ag__wd_open(&b->wd, path, O_RDONLY | O_DIRECTORY, 0, msg, sizeof(msg));
  if (fd < 0) {
    fail(out, "%s", msg);
    return NULL;
  }
  DIR *d = fdopendir(fd);
  if (d == NULL) {
    close(fd);
    fail(out, "out of memory");
  }
  return d;
}

static ag_tool_status tool_list(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  const builtin *b = user;
  const char *path;
  if (get_path(args, "path", ".", &path, out) != 0)
    return AG_TOOL_ERROR;
  DIR *d = open_dir(b, path, out);
  if (d == NULL)
    return AG_TOOL_ERROR;
  names ns = {calloc(b->max_entries, sizeof(char *)), 0, b->max_entries, 0};
  if (ns.v == NULL) {
    closedir(d);
    return fail(out, "out of memory");
  }
  ag_tool_status rc = AG_TOOL_OK;
  struct dirent *e;
  errno = 0;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    unsigned char t = entry_type(dirfd(d), e);
    char suffix = t == DT_DIR ? '/' : t == DT_LNK ? '@' : '\0';
    if (names_add(&ns, e->d_name, suffix) != 0) {
      rc = fail(out, "out of memory");
      break;
    }
    if ((ns.total & 1023) == 0 && cancelled(cancel)) {
      rc = AG_TOOL_CANCELLED;
      break;
    }
  }
  char p[256];
  if (rc == AG_TOOL_OK && e == NULL && errno != 0)
    rc = fail(out, "cannot read the directory %s: %s",
              ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(errno));
  closedir(d);
  if (rc == AG_TOOL_OK) {
    if (ns.total == 0)
      ag_output_printf(out, "(%s is empty)\n",
                       ag__shown(path, SHOWN_PATH, p, sizeof(p)));
    for (size_t i = 0; i < ns.n; i++)
      ag_output_printf(out, "%s\n", ns.v[i]);
    if (ns.total > ns.n)
      ag_output_printf(out,
                       "[%zu more entries not shown: list_dir shows the "
                       "first %zu by name; list a subdirectory or use "
                       "search_text]\n",
                       ns.total - ns.n, ns.n);
  }
  names_free(&ns);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* search_text                                                              */
/* ------------------------------------------------------------------------ */

static const char k_search_desc[] =
    "Search the text files under a path in the workdir for a string and "
    "return the matching lines as path:line:text. The pattern is a fixed "
    "string unless regex is true (then a PCRE2/Perl regular expression). "
    "Binary files, .git directories and symbolic links are skipped.";
static const char k_search_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"pattern\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":1000,"
    "\"description\":\"Text to find (a fixed string unless regex is "
    "true)\"},"
    "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":"
    "\"File or directory relative to the workdir; default \\\".\\\"\"},"
    "\"regex\":{\"type\":\"boolean\",\"description\":"
    "\"Treat pattern as a regular expression; default false\"},"
    "\"ignore_case\":{\"type\":\"boolean\",\"description\":"
    "\"Match case-insensitively; default false\"}},"
    "\"required\":[\"pattern\"],\"additionalProperties\":false}";

typedef struct search {
  const builtin *b;
  pcre2_code *code;
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  ag_cancel *cancel;
  ag_output *out;
  size_t matches, skipped_large, skipped_deep;
  bool full;      /* max_matches reached */
  bool stop;      /* an error or a cancel */
  bool cancelled; /* the stop was a cancel */
} search;

/* Replaces whatever matched so far with the error `msg`. */
static void search_error(search *s, const char *msg) {
  ag__output_reset(s->out);
  fail(s->out, "%s", msg);
  s->stop = true;
}

/* Matches every line of an open regular file; `rel` names it in output. */
static void search_file(search *s, int fd, const char *rel) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return;
  if ((uint64_t)st.st_size > s->b->max_search) {
    s->skipped_large++;
    return;
  }
  size_t len = 0;
  ag_output scratch;
  if (ag__output_init(&scratch, 256) != AG_OK) {
    search_error(s, "out of memory");
    return;
  }
  char *data =
      read_capped(fd, s->b->max_search, &len, rel, s->cancel, &scratch);
  ag__output_free(&scratch);
  if (data == NULL) {
    if (cancelled(s->cancel)) {
      s->stop = s->cancelled = true;
    }
    return; /* unreadable: skipped like a binary file */
  }
  if (len > s->b->max_search || memchr(data, '\0', len) != NULL) {
    s->skipped_large += len > s->b->max_search;
    free(data);
    return;
  }
  size_t line = 1;
  for (size_t i = 0; i <= len && !s->full;) {
    char *nl = memchr(data + i, '\n', len - i);
    size_t end = nl != NULL ? (size_t)(nl - data) : len;
    if (end == len && i == len && len > 0)
      break; /* no empty "line" after a final newline */
    int r = pcre2_match(s->code, (PCRE2_SPTR)(data + i), end - i, 0, 0, s->md,
                        s->mctx);
    if (r == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter, same limits */
      r = pcre2_match(s->code, (PCRE2_SPTR)(data + i), end - i, 0, PCRE2_NO_JIT,
                      s->md, s->mctx);
    if (r >= 0 && s->matches >= s->b->max_matches) {
      s->full = true; /* one more than is shown: say so */
      break;
    }
    if (r >= 0) {
      size_t shown_len = end - i;
      bool cut = false;
      if (shown_len > MAX_LINE_SHOWN) {
        shown_len = ag_utf8_truncate(data + i, end - i, MAX_LINE_SHOWN);
        cut = true;
      }
      ag_output_printf(s->out, "%s:%zu:%.*s%s\n", rel, line, (int)shown_len,
                       data + i, cut ? " [...]" : "");
      s->matches++;
    } else if (r == PCRE2_ERROR_MATCHLIMIT || r == PCRE2_ERROR_DEPTHLIMIT ||
               r == PCRE2_ERROR_HEAPLIMIT) {
      char m[MSG], p[256];
      snprintf(m, sizeof(m),
               "the pattern is too costly to match (PCRE2's match limit) at "
               "%s:%zu; use a simpler pattern or a fixed string",
               ag__shown(rel, 200, p, sizeof(p)), line);
      search_error(s, m);
      break;
    } else if (r != PCRE2_ERROR_NOMATCH) {
      char m[MSG], p[256];
      PCRE2_UCHAR why[160];
      if (pcre2_get_error_message(r, why, sizeof(why)) < 0)
        snprintf((char *)why, sizeof(why), "PCRE2 error %d", r);
      snprintf(m, sizeof(m), "cannot match at %s:%zu: %s",
               ag__shown(rel, 200, p, sizeof(p)), line, (const char *)why);
      search_error(s, m);
      break;
    }
    if (nl == NULL)
      break;
    i = end + 1;
    line++;
  }
  free(data);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Walks the directory `dfd` (owned: closed here), `rel` its path. */
static void search_dir(search *s, int dfd, const char *rel, int depth) {
  DIR *d = fdopendir(dfd);
  if (d == NULL) {
    close(dfd);
    return;
  }
  char **list = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < MAX_DIR_NAMES) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
        strcmp(e->d_name, ".git") == 0)
      continue;
    if (n == cap) {
      size_t nc = cap == 0 ? 64 : cap * 2;
      char **nl = realloc(list, nc * sizeof(*nl));
      if (nl == NULL)
        break;
      list = nl;
      cap = nc;
    }
    if ((list[n] = ag__strdup(e->d_name)) == NULL)
      break;
    n++;
  }
  if (n > 1)
    qsort(list, n, sizeof(*list), cmp_str);
  for (size_t i = 0; i < n && !s->stop && !s->full; i++) {
    if (cancelled(s->cancel)) {
      s->stop = s->cancelled = true;
      break;
    }
    size_t rl = strlen(rel), nl = strlen(list[i]);
    char *child = malloc(rl + nl + 2);
    if (child == NULL)
      break;
    if (strcmp(rel, ".") == 0)
      memcpy(child, list[i], nl + 1);
    else {
      memcpy(child, rel, rl);
      child[rl] = '/';
      memcpy(child + rl + 1, list[i], nl + 1);
    }
    /* Never follows a symlink: O_NOFOLLOW fails on one, O_NONBLOCK keeps a
     * FIFO from blocking. */
    int fd = openat(dirfd(d), list[i],
                    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st;
      if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (depth + 1 > MAX_SEARCH_DEPTH) {
          s->skipped_deep++;
          close(fd);
        } else {
          search_dir(s, fd, child, depth + 1);
        }
      } else {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
          fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        search_file(s, fd, child);
        close(fd);
      }
    }
    free(child);
  }
  for (size_t i = 0; i < n; i++)
    free(list[i]);
  free(list);
  closedir(d);
}

static ag_tool_status tool_search(void *user, const json_t *args,
                                  ag_cancel *cancel, ag_output *out) {
  const builtin *b = user;
  const char *pat, *path;
  size_t plen;
  char p[256], msg[MSG];
  if (get_str(args, "pattern", &pat, &plen, out) != 0 ||
      get_path(args, "path", ".", &path, out) != 0)
    return AG_TOOL_ERROR;
  if (pat == NULL || plen == 0)
    return fail(out, "pattern is empty");
  if (plen > MAX_PATTERN)
    return fail(out, "pattern is %zu bytes; at most %d", plen, MAX_PATTERN);
  bool regex = json_is_true(json_object_get(args, "regex"));
  bool icase = json_is_true(json_object_get(args, "ignore_case"));

  /* PCRE2_LITERAL refuses most other options, \C among them. */
  uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  opts |= regex ? PCRE2_NEVER_BACKSLASH_C : PCRE2_LITERAL;
  if (icase)
    opts |= PCRE2_CASELESS;
  int code;
  PCRE2_SIZE off;
  search s;
  memset(&s, 0, sizeof(s));
  s.b = b;
  s.cancel = cancel;
  s.out = out;
  s.code = pcre2_compile((PCRE2_SPTR)pat, plen, opts, &code, &off, NULL);
  if (s.code == NULL) {
    PCRE2_UCHAR why[160];
    if (pcre2_get_error_message(code, why, sizeof(why)) < 0)
      snprintf((char *)why, sizeof(why), "PCRE2 error %d", code);
    return fail(out,
                "invalid regular expression: %s at offset %zu (set regex to "
                "false to search for the text as it is)",
                (const char *)why, (size_t)off);
  }
  pcre2_jit_compile(s.code, PCRE2_JIT_COMPLETE); /* the interpreter if not */
  s.md = pcre2_match_data_create_from_pattern(s.code, NULL);
  s.mctx = pcre2_match_context_create(NULL);
  ag_tool_status rc = AG_TOOL_OK;
  if (s.md == NULL || s.mctx == NULL) {
    rc = fail(out, "out of memory");
    goto done;
  }
  pcre2_set_match_limit(s.mctx, MATCH_LIMIT);
  pcre2_set_depth_limit(s.mctx, MATCH_DEPTH);
  pcre2_set_heap_limit(s.mctx, MATCH_HEAP_KIB);

  int fd =
      ag__wd_open(&b->wd, path, O_RDONLY | O_NONBLOCK, 0, msg, sizeof(msg));
  if (fd < 0) {
    rc = fail(out, "%s", msg);
    goto done;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    rc = fail(out, "cannot stat %s: %s",
              ag__shown(path, SHOWN_PATH, p, sizeof(p)), etext(errno));
    goto done;
  }
  if (S_ISDIR(st.st_mode)) {
    search_dir(&s, fd, path, 0);
  } else {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
      fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    search_file(&s, fd, path);
    close(fd);
  }
  if (s.cancelled) {
    rc = AG_TOOL_CANCELLED;
    goto done;
  }
  if (s.stop) {
    rc = AG_TOOL_ERROR;
    goto done;
  }
  if (s.matches == 0)
    ag_output_printf(out, "No matches for %s in %s\n",
                     regex ? "the regular expression" : "the text",
                     ag__shown(path, SHOWN_PATH, p, sizeof(p)));
  if (s.full)
    ag_output_printf(out,
                     "[stopped at %zu matches; narrow the path or the "
                     "pattern]\n",
                     s.matches);
  if (s.skipped_large > 0)
    ag_output_printf(out, "[%zu files larger than %zu bytes skipped]\n",
                     s.skipped_large, b->max_search);
  if (s.skipped_deep > 0)
    ag_output_printf(out, "[%zu directories deeper than %d levels skipped]\n",
                     s.skipped_deep, MAX_SEARCH_DEPTH);
done:
  pcre2_match_context_free(s.mctx);
  pcre2_match_data_free(s.md);
  pcre2_code_free(s.code);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* run_command                                                              */
/* ------------------------------------------------------------------------ */

static const char k_run_desc[] =
    "Run a command in the workdir and return its exit status, standard "
    "output and standard error. Give either command (a shell command line, "
    "run with sh -c) or argv (the program and its arguments, no shell). The "
    "command is stopped when it runs past its time limit.";
static const char k_run_schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"command\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":65536,"
    "\"description\":\"A shell command line, run with sh -c in the "
    "workdir\"},"
    "\"argv\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":256,"
    "\"items\":{\"type\":\"string\"},\"description\":"
    "\"Program and arguments, run without a shell in the workdir\"}},"
    "\"additionalProperties\":false}";

static void append_stream(ag_output *out, const char *label,
                          const ag_output *s) {
  if (s->len == 0)
    return;
  ag_output_printf(out, "\n[%s]\n", label);
  ag_output_write(out, s->buf, s->len);
}

static ag_tool_status tool_run(void *user, const json_t *args,
                               ag_cancel *cancel, ag_output *out) {
  const builtin *b = user;
  const char *cmd;
  size_t clen;
  if (get_str(args, "command", &cmd, &clen, out) != 0)
    return AG_TOOL_ERROR;
  json_t *jargv = json_object_get(args, "argv");
  if ((cmd != NULL) == (jargv != NULL))
    return fail(out, "give exactly one of command (a shell command line) and "
                     "argv (a program and its arguments)");
  const char *argv[MAX_ARGV + 1];
  if (cmd != NULL) {
    argv[0] = b->shell;
    argv[1] = "-c";
    argv[2] = cmd;
    argv[3] = NULL;
  } else {
    size_t n = json_array_size(jargv);
    if (!json_is_array(jargv) || n == 0 || n > MAX_ARGV)
      return fail(out, "argv: give 1 to %d strings", MAX_ARGV);
    for (size_t i = 0; i < n; i++) {
      json_t *a = json_array_get(jargv, i);
      if (!json_is_string(a))
        return fail(out, "argv[%zu]: expected a string", i);
      argv[i] = json_string_value(a);
      if (strlen(argv[i]) != json_string_length(a))
        return fail(out, "argv[%zu] contains a NUL byte", i);
    }
    argv[n] = NULL;
    if (argv[0][0] == '\0')
      return fail(out, "argv[0] is empty; it names the program to run");
  }
  ag_output so, se;
  if (ag__output_init(&so, b->max_output) != AG_OK)
    return fail(out, "out of memory");
  if (ag__output_init(&se, b->max_output) != AG_OK) {
    ag__output_free(&so);
    return fail(out, "out of memory");
  }
  /* The minimal environment every subprocess tool gets
   * (docs/security.md): no API key of the agent reaches a command. */
  char **envp = NULL;
  if (ag__env_build(NULL, false, &envp) != AG_OK) {
    ag__output_free(&so);
    ag__output_free(&se);
    return fail(out, "out of memory");
  }
  ag__proc_info info;
  ag_tool_status st =
      ag__subprocess_run_in(b->wd.root, argv, NULL, envp, KILL_GRACE_MS, NULL,
                            0, cancel, &so, &se, &info);
  free(envp);
  if (st == AG_TOOL_OK) {
    ag_output_write(out, so.buf, so.len);
    append_stream(out, "stderr", &se);
    if (so.len == 0 && se.len == 0)
      ag_output_printf(out, "(exit status 0, no output)");
  } else if (st == AG_TOOL_ERROR) {
    ag_output_set_transient(out, false);
    if (info.exec_failed)
      ag_output_write(out, se.buf, se.len);
    else if (info.exit_code > 0)
      ag_output_printf(out, "command exited with status %d", info.exit_code);
    else
      ag_output_printf(out, "command killed by signal %d", info.term_signal);
    if (!info.exec_failed) {
      append_stream(out, "stdout", &so);
      append_stream(out, "stderr", &se);
    }
  }
  ag__output_free(&so);
  ag__output_free(&se);
  return st;
}

/* ------------------------------------------------------------------------ */
/* Registration                                                             */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_builtin_opts_init(ag_builtin_opts *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof(*o));
  o->command_timeout_ms = -1;
  o->resolve = AG_RESOLVE_AUTO;
}

static void builtin_free(void *p) {
  builtin *b = p;
  if (b == NULL)
    return;
  ag__wd_close(&b->wd);
  free(b->shell);
  free(b);
}

typedef struct spec {
  const char *name, *desc, *schema;
  ag_tool_fn fn;
} spec;

static const spec k_specs[] = {
    {"read_file", k_read_desc, k_read_schema, tool_read},
    {"write_file", k_write_desc, k_write_schema, tool_write},
    {"edit_file", k_edit_desc, k_edit_schema, tool_edit},
    {"list_dir", k_list_desc, k_list_schema, tool_list},
    {"search_text", k_search_desc, k_search_schema, tool_search},
    {"run_command", k_run_desc, k_run_schema, tool_run},
};
#define N_SPECS (sizeof(k_specs) / sizeof(k_specs[0]))

AG_EXTERN ag_err_t ag_builtin_register(ag_registry *reg,
                                       const ag_builtin_opts *opts,
                                       ag_error_t *err) {
  if (reg == NULL || opts == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "builtin tools: no registry or options");
  if (opts->workdir == NULL || opts->workdir[0] == '\0')
    return ag__set_error(err, AG_EINVAL, -1, "builtin tools: no workdir given");
  if (opts->resolve != AG_RESOLVE_AUTO && opts->resolve != AG_RESOLVE_OPENAT2 &&
      opts->resolve != AG_RESOLVE_WALK)
    return ag__set_error(err, AG_EINVAL, -1,
                         "builtin tools: unknown resolve mode %d",
                         (int)opts->resolve);
  size_t n_tools = opts->allow_commands ? N_SPECS : N_SPECS - 1;
  for (size_t i = 0; i < n_tools; i++)
    if (ag_registry_get(reg, k_specs[i].name) != NULL)
      return ag__set_error(err, AG_EINVAL, -1,
                           "tools.%s: a tool with this name is already "
                           "registered; the built-in tools need the name",
                           k_specs[i].name);

  builtin *b = calloc(1, sizeof(*b));
  if (b == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  b->wd.root = -1;
  b->max_read = opts->max_read_bytes > 0 ? opts->max_read_bytes : DEF_READ;
  b->max_write = opts->max_write_bytes > 0 ? opts->max_write_bytes : DEF_WRITE;
  b->max_entries =
      opts->max_list_entries > 0 ? opts->max_list_entries : DEF_ENTRIES;
  b->max_matches = opts->max_matches > 0 ? opts->max_matches : DEF_MATCHES;
  b->max_search =
      opts->max_search_bytes > 0 ? opts->max_search_bytes : DEF_SEARCH;
  b->max_output = opts->max_output > 0 ? opts->max_output : DEF_CMD_OUTPUT;
  b->shell = ag__strdup(opts->shell != NULL ? opts->shell : "/bin/sh");
  if (b->shell == NULL) {
    free(b);
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  }
  ag_err_t rc = ag__wd_open_root(&b->wd, opts->workdir, opts->resolve, err);
  if (rc != AG_OK) {
    builtin_free(b);
    return rc;
  }
  if (ag__registry_own(reg, b, builtin_free) != AG_OK) {
    builtin_free(b);
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  }
  for (size_t i = 0; i < n_tools; i++) {
    const spec *s = &k_specs[i];
    ag_tool_def d;
    ag_tool_def_init(&d);
    d.name = s->name;
    d.description = s->desc;
    d.parameters = s->schema;
    d.fn = s->fn;
    d.user = b;
    if (s->fn == tool_read)
      d.max_output = b->max_read + 1024;
    if (s->fn == tool_search)
      d.max_output = b->max_matches * (MAX_LINE_SHOWN + 300) + 4096;
    if (s->fn == tool_run) {
      d.requires_approval = !opts->yes;
      d.idempotent = false;
      d.max_retries = 0;
      d.timeout_ms = opts->command_timeout_ms;
      d.max_output = 2 * b->max_output + 1024;
    }
    if (s->fn == tool_write || s->fn == tool_edit)
      d.idempotent = s->fn == tool_write; /* an edit applied twice fails */
    rc = ag_registry_add(reg, &d, err);
    if (rc != AG_OK)
      return rc;
  }
  return AG_OK;
}
