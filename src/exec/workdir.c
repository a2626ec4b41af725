/*
 * src/exec/workdir.c - opening paths confined beneath a directory (the
 * built-in tools' workdir), race-free, with openat2(RESOLVE_BENEATH) or a
 * component-by-component walk where the kernel lacks it.
 *
 * The workdir is held as an O_PATH directory descriptor opened once; every
 * later open is relative to it, so renaming or replacing the workdir's own
 * path afterwards changes nothing.
 *
 * openat2 (Linux 5.6). RESOLVE_BENEATH makes the kernel refuse, with EXDEV,
 * any resolution that would leave the starting directory: "..", absolute
 * symlinks, relative symlinks that climb out, at any depth, checked against
 * concurrent renames (the kernel answers EAGAIN when a rename raced with the
 * lookup; we retry a few times). RESOLVE_NO_MAGICLINKS refuses procfs-style
 * links (/proc/self/fd/N), which point wherever their descriptor does.
 * Symlinks that stay inside are followed, as a user expects.
 *
 * The walk (kernels before 5.6, or seccomp filters that answer ENOSYS or
 * EPERM). The path is taken one component at a time from a buffer; each
 * directory is opened with openat(cur, name, O_PATH | O_NOFOLLOW) relative
 * to the descriptor of the one before, and kept on a stack. ".." pops the
 * stack - at the bottom it is an escape - so it goes back to the directory
 * the walk actually came through, never to whatever ".." names on disk now.
 * A component that turns out to be a symlink is read (readlinkat on the
 * O_PATH descriptor of the link itself), refused when its target is
 * absolute (as RESOLVE_BENEATH does), and otherwise spliced in front of the
 * rest of the path, so its ".."s are checked by the same stack; at most
 * MAX_LINKS links per path (ELOOP, as the kernel). The last component is
 * opened with the caller's flags plus O_NOFOLLOW; ELOOP there means a
 * symlink, which is read and spliced the same way (a dangling symlink
 * inside the workdir to a new name inside it is created, as openat2 does).
 * No descriptor the walk opens follows a link by itself, so nothing a
 * concurrent process swaps in can redirect it outside: at worst the walk
 * fails.
 *
 * Auto mode probes openat2 once, when the workdir is opened, and picks the
 * walk when the probe fails with ENOSYS or EPERM; tests force either mode.
 *
 * Not contained (docs/tools.md): hard links (a file inside hard-linked to
 * one outside is the same file; the tools refuse to write to a file with
 * more than one link), bind mounts inside the workdir, and anything a
 * subprocess does.
 *
 * Threading: an ag__wd is read-only after ag__wd_open_root; any number of
 * threads may open paths beneath it at once.
 */
#define _GNU_SOURCE /* O_PATH, openat2 flags, readlinkat on "" */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define MAX_LINKS 40       /* symlinks followed per path, as the kernel */
#define MAX_DEPTH 256      /* directories on the walk's stack */
#define WALK_BUF 8192      /* the path while symlinks are spliced in */
#define OPENAT2_RETRIES 16 /* EAGAIN from a racing rename */
#define SHOWN 200          /* bytes of a path quoted in a message */

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

/* The path for a message: control bytes as '?', cut on a UTF-8 boundary. */
static void shown(char *dst, size_t cap, const char *path) {
  size_t n = strlen(path),
         keep = n > SHOWN ? ag_utf8_truncate(path, n, SHOWN) : n;
  if (keep + 4 > cap)
    keep = ag_utf8_truncate(path, n, cap > 4 ? cap - 4 : 0);
  size_t j = 0;
  for (size_t i = 0; i < keep; i++)
    dst[j++] = (unsigned char)path[i] < 0x20 || path[i] == 0x7f ? '?' : path[i];
  if (keep < n) {
    memcpy(dst + j, "...", 3);
    j += 3;
  }
  dst[j] = '\0';
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int
wfail(char *msg, size_t cap, int e, const char *fmt, ...) {
  if (msg != NULL && cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
  }
  errno = e;
  return -1;
}

/* The message for a failed resolution of `path`, errno `e`. */
static int why(char *msg, size_t cap, int e, const char *path) {
  char p[SHOWN + 8], eb[96];
  shown(p, sizeof(p), path);
  switch (e) {
  case EXDEV:
    return wfail(msg, cap, e, "path escapes the workdir: %s", p);
  case ENOENT:
    return wfail(msg, cap, e, "no such file or directory: %s", p);
  case ENOTDIR:
    return wfail(msg, cap, e, "not a directory: %s", p);
  case EISDIR:
    return wfail(msg, cap, e, "is a directory: %s", p);
  case ELOOP:
    return wfail(msg, cap, e,
                 "too many levels of symbolic links (or a procfs link): %s", p);
  case ENXIO: /* O_NONBLOCK writing to a FIFO without a reader */
    return wfail(msg, cap, e, "%s is not a regular file", p);
  case ENAMETOOLONG:
    return wfail(msg, cap, e, "path too long: %s", p);
  case EACCES:
  case EPERM:
    return wfail(msg, cap, e, "permission denied: %s", p);
  default:
    return wfail(msg, cap, e, "cannot open %s: %s", p,
                 strerror_r(e, eb, sizeof(eb)));
  }
}

static int openat2_raw(int dirfd, const char *path, int flags, mode_t mode) {
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = (uint64_t)(flags | O_CLOEXEC);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? (uint64_t)mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (int tries = 0;; tries++) {
    long fd = syscall(SYS_openat2, (long)dirfd, path, &how, sizeof(how));
    if (fd >= 0)
      return (int)fd;
    if (errno == EINTR || (errno == EAGAIN && tries < OPENAT2_RETRIES))
      continue;
    return -1;
  }
}

ag_err_t ag__wd_open_root(ag__wd *wd, const char *dir, ag_resolve_mode mode,
                          ag_error_t *err) {
  wd->root = -1;
  wd->walk = false;
  if (dir == NULL || dir[0] == '\0')
    return ag__set_error(err, AG_EINVAL, -1, "workdir: no directory given");
  int fd;
  do
    fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int e = errno;
    char p[SHOWN + 8], eb[96];
    shown(p, sizeof(p), dir);
    ag__set_error(err, e == ENOENT || e == ENOTDIR ? AG_ENOTFOUND : AG_EIO, -1,
                  "workdir %s: %s", p, strerror_r(e, eb, sizeof(eb)));
    if (err != NULL)
      err->sys_errno = e;
    return e == ENOENT || e == ENOTDIR ? AG_ENOTFOUND : AG_EIO;
  }
  wd->root = fd;
  if (mode == AG_RESOLVE_WALK) {
    wd->walk = true;
  } else {
    int probe = openat2_raw(fd, ".", O_PATH | O_DIRECTORY, 0);
    if (probe >= 0) {
      close(probe);
    } else if (mode == AG_RESOLVE_AUTO && (errno == ENOSYS || errno == EPERM)) {
      wd->walk = true;
    } else {
      int e = errno;
      char eb[96];
      close(fd);
      wd->root = -1;
      ag__set_error(err, AG_EIO, -1, "workdir: openat2 is not usable: %s",
                    strerror_r(e, eb, sizeof(eb)));
      if (err != NULL)
        err->sys_errno = e;
      return AG_EIO;
    }
  }
  return AG_OK;
}

void ag__wd_close(ag__wd *wd) {
  if (wd != NULL && wd->root >= 0) {
    close(wd->root);
    wd->root = -1;
  }
}

/* ---- the walk ----------------------------------------------------------- */

typedef struct walk {
  int stack[MAX_DEPTH]; /* directories below the root, innermost last */
  int depth;
  char buf[WALK_BUF]; /* rest of the path: buf[pos..len) */
  size_t pos, len;
  int links;
} walk;

static int cur_fd(const ag__wd *wd, const walk *w) {
  return w->depth > 0 ? w->stack[w->depth - 1] : wd->root;
}

static void walk_free(walk *w) {
  while (w->depth > 0)
    close(w->stack[--w->depth]);
}

/* Reads the symlink open as `lfd` (O_PATH) and puts its target in front of
 * the rest of the path. 0, or -1 with errno. */
static int splice_link(walk *w, int lfd) {
  char target[WALK_BUF];
  ssize_t n;
  do
    n = readlinkat(lfd, "", target, sizeof(target));
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -1;
  if ((size_t)n >= sizeof(target) || n == 0) {
    errno = n == 0 ? ENOENT : ENAMETOOLONG;
    return -1;
  }
  if (target[0] == '/' || memchr(target, '\0', (size_t)n) != NULL) {
    errno = EXDEV; /* absolute: RESOLVE_BENEATH refuses these too */
    return -1;
  }
  if (++w->links > MAX_LINKS) {
    errno = ELOOP;
    return -1;
  }
  size_t rest = w->len - w->pos;
  size_t need = (size_t)n + (rest > 0 ? 1 : 0) + rest;
  if (need >= sizeof(w->buf)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memmove(w->buf + (size_t)n + (rest > 0 ? 1 : 0), w->buf + w->pos, rest);
  memcpy(w->buf, target, (size_t)n);
  if (rest > 0)
    w->buf[n] = '/';
  w->pos = 0;
  w->len = need;
  w->buf[w->len] = '\0';
  return 0;
}

/* Whether `fd`'s file (O_PATH) is a symlink; -1 on error. */
static int is_link(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return -1;
  return S_ISLNK(st.st_mode) ? 1 : 0;
}

static int walk_open(const ag__wd *wd, const char *path, int flags,
                     mode_t mode) {
  walk *w = malloc(sizeof(*w));
  if (w == NULL) {
    errno = ENOMEM;
    return -1;
  }
  w->depth = 0;
  w->links = 0;
  w->pos = 0;
  w->len = strlen(path);
  if (w->len >= sizeof(w->buf)) {
    free(w);
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(w->buf, path, w->len + 1);
  /* A trailing slash, anywhere in the spliced path's end, asks for a
   * directory; it is noted once for the caller's path. */
  bool want_dir = w->len > 0 && path[w->len - 1] == '/';
  int result = -1, e = 0;

  for (;;) {
    while (w->pos < w->len && w->buf[w->pos] == '/')
      w->pos++;
    if (w->pos >= w->len) {
      /* Ran out of components: the current directory itself. */
      if ((flags & O_CREAT) != 0 && (flags & O_DIRECTORY) == 0) {
        e = EISDIR;
        break;
      }
      int f;
      do
        f = openat(cur_fd(wd, w), ".",
                   (flags & ~(O_CREAT | O_EXCL)) | O_CLOEXEC);
      while (f < 0 && errno == EINTR);
      if (f < 0)
        e = errno;
      result = f;
      break;
    }
    size_t start = w->pos;
    while (w->pos < w->len && w->buf[w->pos] != '/')
      w->pos++;
    size_t clen = w->pos - start;
    char comp[NAME_MAX + 1];
    if (clen > NAME_MAX) {
      e = ENAMETOOLONG;
      break;
    }
    memcpy(comp, w->buf + start, clen);
    comp[clen] = '\0';
    size_t after = w->pos;
    while (after < w->len && w->buf[after] == '/')
      after++;
    bool last = after >= w->len;
    bool slash_after = w->pos < w->len;

    if (strcmp(comp, ".") == 0)
      continue;
    if (strcmp(comp, "..") == 0) {
      if (w->depth == 0) {
        e = EXDEV;
        break;
      }
      close(w->stack[--w->depth]);
      continue;
    }

    if (!last || slash_after || want_dir) {
      /* A directory on the way (or a final name given with a slash). */
      int f;
      do
        f = openat(cur_fd(wd, w), comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
      while (f < 0 && errno == EINTR);
      if (f < 0) {
        e = errno;
        break;
      }
      struct stat st;
      if (fstat(f, &st) != 0) {
        e = errno;
        close(f);
        break;
      }
      if (S_ISLNK(st.st_mode)) {
        int r = splice_link(w, f);
        e = errno;
        close(f);
        if (r != 0)
          break;
        continue;
      }
      if (!S_ISDIR(st.st_mode)) {
        close(f);
        e = ENOTDIR;
        break;
      }
      if (w->depth >= MAX_DEPTH) {
        close(f);
        e = ENAMETOOLONG;
        break;
      }
      w->stack[w->depth++] = f;
      continue;
    }

    /* The last component, with the caller's flags. */
    int f;
    do
      f = openat(cur_fd(wd, w), comp, flags | O_NOFOLLOW | O_CLOEXEC, mode);
    while (f < 0 && errno == EINTR);
    if (f >= 0) {
      result = f;
      break;
    }
    e = errno;
    if (e != ELOOP && e != ENOTDIR && e != EEXIST)
      break;
    /* Perhaps a symlink (O_NOFOLLOW answers ELOOP; with O_DIRECTORY some
     * kernels answer ENOTDIR; O_CREAT|O_EXCL answers EEXIST). */
    int lf;
    do
      lf = openat(cur_fd(wd, w), comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    while (lf < 0 && errno == EINTR);
    if (lf < 0)
      break; /* keep the first errno */
    int link = is_link(lf);
    if (link != 1 || (flags & O_EXCL) != 0) {
      close(lf);
      break;
    }
    int r = splice_link(w, lf);
    int e2 = errno;
    close(lf);
    if (r != 0) {
      e = e2;
      break;
    }
  }
  walk_free(w);
  free(w);
  if (result < 0)
    errno = e;
  return result;
}

int ag__wd_open(const ag__wd *wd, const char *path, int flags, mode_t mode,
                char *msg, size_t msg_cap) {
  if (path[0] == '\0')
    return wfail(msg, msg_cap, ENOENT, "path is empty");
  size_t n = strlen(path);
  if (n > AG__WD_PATH_MAX) {
    char p[64];
    shown(p, sizeof(p), path);
    return wfail(msg, msg_cap, ENAMETOOLONG,
                 "path is too long: %zu bytes (at most %d): %s", n,
                 AG__WD_PATH_MAX, p);
  }
  if (path[0] == '/') {
    char p[SHOWN + 8];
    shown(p, sizeof(p), path);
    return wfail(msg, msg_cap, EXDEV,
                 "path escapes the workdir: %s (absolute paths are not "
                 "allowed; give a path relative to the workdir)",
                 p);
  }
  int fd = wd->walk ? walk_open(wd, path, flags, mode)
                    : openat2_raw(wd->root, path, flags, mode);
  if (fd < 0)
    return why(msg, msg_cap, errno, path);
  return fd;
}

int ag__wd_mkdirs(const ag__wd *wd, const char *dir, char *msg,
                  size_t msg_cap) {
  size_t n = strlen(dir);
  if (n == 0)
    return 0;
  if (n > AG__WD_PATH_MAX || dir[0] == '/') {
    /* ag__wd_open refuses both, with its message and errno. */
    int fd = ag__wd_open(wd, dir, O_PATH | O_DIRECTORY, 0, msg, msg_cap);
    if (fd >= 0)
      close(fd);
    return -1;
  }
  char *prefix = malloc(n + 1);
  if (prefix == NULL)
    return wfail(msg, msg_cap, ENOMEM, "out of memory");
  int parent = -1, rc = 0;
  size_t i = 0;
  while (i < n) {
    while (i < n && dir[i] == '/')
      i++;
    if (i >= n)
      break;
    size_t start = i;
    while (i < n && dir[i] != '/')
      i++;
    memcpy(prefix, dir, i);
    prefix[i] = '\0';
    int fd = ag__wd_open(wd, prefix, O_PATH | O_DIRECTORY, 0, msg, msg_cap);
    if (fd < 0 && errno == ENOENT) {
      /* Create the missing component inside the parent we hold (the
       * workdir itself for the first one), then open it confined again. */
      char comp[NAME_MAX + 1];
      size_t clen = i - start;
      if (clen > NAME_MAX) {
        rc = why(msg, msg_cap, ENAMETOOLONG, prefix);
        break;
      }
      memcpy(comp, dir + start, clen);
      comp[clen] = '\0';
      int base = parent >= 0 ? parent : wd->root;
      if (mkdirat(base, comp, 0777) != 0 && errno != EEXIST) {
        rc = why(msg, msg_cap, errno, prefix);
        break;
      }
      fd = ag__wd_open(wd, prefix, O_PATH | O_DIRECTORY, 0, msg, msg_cap);
    }
    if (fd < 0) {
      rc = -1;
      break;
    }
    if (parent >= 0)
      close(parent);
    parent = fd;
  }
  int e = errno;
  if (parent >= 0)
    close(parent);
  free(prefix);
  errno = e;
  return rc;
}
