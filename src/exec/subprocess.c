/*
 * src/exec/subprocess.c - runs a subprocess tool: fork/exec in its own
 * process group, stdin fed from memory, stdout and stderr captured into
 * bounded buffers, the attempt's cancel token watched, the whole group
 * terminated on cancel, the child always reaped.
 *
 * Spawning (spawn_child). Four pipes, all pipe2(O_CLOEXEC): stdin, stdout,
 * stderr and an "exec status" pipe. The calling thread blocks every signal
 * around fork() so no handler of the application can run in the child before
 * the child has reset it. Between fork and exec the child makes only
 * async-signal-safe calls (sigaction, setpgid, fcntl, dup2, close_range,
 * getrlimit/setrlimit - plain syscalls in glibc though not on POSIX's list -
 * and execvp, whose PATH search in glibc uses the stack, not malloc):
 * it starts its own process group, resets every signal disposition to the
 * default and unblocks the mask, moves the pipe ends onto 0/1/2, marks every
 * other inherited descriptor close-on-exec (a tool gets exactly stdin,
 * stdout and stderr, like Python's close_fds=True: a descriptor some other
 * part of the application opened without O_CLOEXEC never reaches a tool),
 * applies the rlimits and execs. A run with a working directory
 * (ag__subprocess_run_in) fchdir()s to it first, before the descriptors
 * move. A failure on that path writes {stage,
 * errno} (8 bytes, atomic on a pipe) to the status pipe and _exit(127)s. The
 * parent also calls setpgid(pid, pid) so the group exists whichever side
 * runs first.
 *
 * The status pipe is never read with a blocking read. libuv blocks until
 * EOF, which comes at exec; but a fork() by another thread of the
 * application between our pipe2() and close() holds the write end until
 * *its* child execs, forever if it never does. Here the status pipe is read
 * once, non-blocking, after the child has been reaped: by then the child
 * has either exec'd (no bytes) or written its 8 bytes and exited.
 *
 * The loop (ag__subprocess_run). One poll() over: our stdin write end
 * (POLLOUT while input is left), stdout and stderr read ends, a pidfd of the
 * child (readable when it exits), and the cancel chain's eventfds until the
 * token fires. The poll timeout is the earliest of: the chain's deadline,
 * the SIGKILL time, the orphan grace; after each wake-up ag_cancel_check()
 * decides. All our pipe ends are non-blocking, so input is written in
 * whatever pieces the pipe takes, interleaved with reading: a child that
 * writes a lot before reading its stdin cannot deadlock us. Each stream is
 * read in bounded rounds so one chatty stream cannot starve the other, the
 * stdin writer or the cancel check.
 *
 * Exit detection without SIGCHLD. A library must not install a SIGCHLD
 * handler (the application may own it), and signalfd needs SIGCHLD blocked
 * in every thread. A pidfd (pidfd_open, Linux 5.3) is a pollable, per-child,
 * close-on-exec descriptor: exit wakes the same poll() that watches the
 * pipes, at no cost. Where pidfd_open is missing (ENOSYS, seccomp) the loop
 * falls back to waitid(WNOHANG) at an interval of 1 ms doubling to 16 ms.
 * Either way the child is observed exiting without being reaped (pidfd, or
 * waitid's WNOWAIT): a zombie keeps its pid, so its process group id cannot
 * be reused while we may still send kill(-pgid); we reap last.
 *
 * Termination. On cancel: kill(-pgid, SIGTERM), stdin closed, pipes still
 * drained; at cancel time + kill_grace_ms, kill(-pgid, SIGKILL). When the
 * direct child has exited but the pipes are still open (grandchildren
 * holding them; the tool's own exit, or after SIGTERM), we wait at most
 * ORPHAN_GRACE_MS more, then SIGKILL the group, read what is already in the
 * pipes and stop. After a normal exit with the pipes closed the group is not
 * signalled: a background process that let go of our pipes is the tool's
 * business. Once the child is dead and reaped nothing in the group can keep
 * us: a process that left the group and kept the pipes is abandoned after
 * the grace.
 *
 * Output caps. Each stream keeps at most cap - MARK_RESERVE bytes (the whole
 * cap when the cap is tiny); the rest is read and discarded, never stored.
 * At the end a truncated stream loses an incomplete trailing UTF-8 sequence
 * and gets "\n[output truncated: N bytes dropped]" in the reserved room; the
 * buffer's `truncated` and `dropped` say the same.
 *
 * Result. Cancelled: AG_TOOL_TIMEOUT for AG_CANCEL_TIMEOUT, else
 * AG_TOOL_CANCELLED, whatever the child then did (a run that had already
 * finished - exited and pipes closed - before the cancel was seen is
 * reported as it finished). Exit 0: AG_TOOL_OK. Otherwise AG_TOOL_ERROR,
 * and when stderr is empty a message is written into it: "exited with
 * status N", "killed by signal N (Description)", "cannot run 'x': <strerror>".
 * When stderr is not empty it is the message as is (the exit status is in
 * `info`); this is the scenario rule "a non-zero exit is an error with
 * stderr as message".
 *
 * SIGPIPE. Writing to a pipe whose reader is gone raises SIGPIPE in the
 * writing thread, and the library must not change the process's signal
 * dispositions. So while a run writes input, SIGPIPE is blocked in the
 * calling thread only (pthread_sigmask); after a write fails with EPIPE the
 * SIGPIPE it generated is consumed with sigtimedwait(0) - unless one was
 * already pending before we blocked it, which is then left for the
 * application - and the old mask is restored. Rejected: a socketpair for
 * stdin with send(MSG_NOSIGNAL) (a tool's stdin would not be a pipe:
 * `cat /dev/stdin` fails on a socket).
 *
 * Threading: any number of runs at once on different threads; a run uses
 * only its own descriptors and buffers. Every descriptor is created
 * close-on-exec, so a concurrent spawn on another thread never leaks ours
 * into its child. Every syscall is retried on EINTR, except close(), which
 * Linux always completes.
 *
 * Rejected: posix_spawn. glibc's (clone with CLONE_VFORK) is cheaper for a
 * large parent and reports exec errors itself, and SETSIGDEF, SETSIGMASK
 * and SETPGROUP cover the signal and group steps, but it cannot set rlimits
 * in the child (setting them in the parent around the spawn would race with
 * every other thread). Also rejected: a SIGCHLD handler or signalfd (the
 * application owns process-wide signal state); a blocking waitpid once the
 * pipes close (a child that closed stdout and kept running would make us
 * deaf to the cancel token).
 *
 * Limits of a library: if the application ignores SIGCHLD (or sets
 * SA_NOCLDWAIT) the kernel reaps the child itself and its exit status is
 * lost (reported as an error); an application thread calling waitpid(-1)
 * can steal the status the same way.
 */
#define _GNU_SOURCE /* pipe2, close_range flags, sigdescr_np, NSIG */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

enum {
  READ_CHUNK = 16384,       /* bytes per read(); a stack buffer */
  READS_PER_WAKE = 16,      /* read() calls per stream per wake-up */
  WRITE_CHUNK = 65536,      /* bytes per write() to stdin */
  ORPHAN_GRACE_MS = 50,     /* pipes open after the child exited */
  MARK_RESERVE = 64,        /* room kept for the truncation mark */
  CANCEL_FDS = 16,          /* eventfds of the cancel chain we poll */
  FALLBACK_MAX_WAIT_MS = 16 /* no pidfd: longest sleep between waitid */
};

/* Where the child failed before exec; sent through the status pipe. */
enum { STAGE_PGID = 1, STAGE_STDIO, STAGE_RLIMIT, STAGE_EXEC, STAGE_CWD };

/* ---- small helpers ------------------------------------------------------ */

static void close_fd(int *fd) {
  if (*fd >= 0) {
    close(*fd); /* never retried: Linux releases the fd even on EINTR */
    *fd = -1;
  }
}

static int set_nonblock(int fd) {
  int fl;
  do
    fl = fcntl(fd, F_GETFL);
  while (fl < 0 && errno == EINTR);
  if (fl < 0)
    return -1;
  int r;
  do
    r = fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  while (r < 0 && errno == EINTR);
  return r;
}

static int64_t add_ms(int64_t t, int64_t d) {
  if (d < 0)
    d = 0;
  return t > INT64_MAX - d ? INT64_MAX : t + d;
}

static int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* Description of a signal; thread-safe (strsignal is not). */
static const char *signal_text(int sig) {
#if defined(__GLIBC__) &&                                                      \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  const char *d = sigdescr_np(sig);
  return d != NULL ? d : "unknown signal";
#else
  switch (sig) {
  case SIGHUP:
    return "Hangup";
  case SIGINT:
    return "Interrupt";
  case SIGQUIT:
    return "Quit";
  case SIGILL:
    return "Illegal instruction";
  case SIGTRAP:
    return "Trace/breakpoint trap";
  case SIGABRT:
    return "Aborted";
  case SIGBUS:
    return "Bus error";
  case SIGFPE:
    return "Floating point exception";
  case SIGKILL:
    return "Killed";
  case SIGSEGV:
    return "Segmentation fault";
  case SIGPIPE:
    return "Broken pipe";
  case SIGALRM:
    return "Alarm clock";
  case SIGTERM:
    return "Terminated";
  case SIGXCPU:
    return "CPU time limit exceeded";
  case SIGXFSZ:
    return "File size limit exceeded";
  default:
    return "unknown signal";
  }
#endif
}

/* Description of an errno value; thread-safe. */
static const char *errno_text(int e, char *buf, size_t cap) {
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  return strerror_r(e, buf, cap); /* GNU variant: returns the text */
#else
  if (strerror_r(e, buf, cap) != 0)
    snprintf(buf, cap, "error %d", e);
  return buf;
#endif
}

/* ---- SIGPIPE, per thread ------------------------------------------------ */

typedef struct sigpipe_guard {
  bool active;
  bool was_pending; /* a SIGPIPE was pending before we blocked it */
  bool raised;      /* a write of ours failed with EPIPE */
  sigset_t old;
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g) {
  sigset_t set, pending;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigemptyset(&pending);
  sigpending(&pending);
  g->was_pending = sigismember(&pending, SIGPIPE) == 1;
  g->raised = false;
  g->active = pthread_sigmask(SIG_BLOCK, &set, &g->old) == 0;
}

static void sigpipe_restore(sigpipe_guard *g) {
  if (!g->active)
    return;
  if (g->raised && !g->was_pending) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    struct timespec zero = {0, 0};
    /* Fails with EAGAIN when none is pending (SIGPIPE ignored). */
    while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
  g->active = false;
}

/* ---- the child, between fork and exec ----------------------------------- */

/* Reports {stage, errno} and exits; async-signal-safe. */
static void child_fail(int status_fd, int stage, int e) {
  int msg[2] = {stage, e};
  ssize_t r;
  do
    r = write(status_fd, msg, sizeof(msg));
  while (r < 0 && errno == EINTR);
  _exit(127);
}

/* Returns fd, or a duplicate >= 3 of it (close-on-exec); -1 on failure. */
static int child_lift_fd(int fd) {
  if (fd >= 3)
    return fd;
  int r;
  do
    r = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  while (r < 0 && errno == EINTR);
  return r;
}

static int child_set_limit(int resource, int64_t want, rlim_t extra_hard) {
  struct rlimit cur;
  if (getrlimit(resource, &cur) != 0)
    return -1;
  rlim_t soft = (rlim_t)want;
  rlim_t hard = soft + extra_hard;
  if (cur.rlim_max != RLIM_INFINITY && hard > cur.rlim_max)
    hard = cur.rlim_max;
  if (soft > hard)
    soft = hard;
  struct rlimit nl = {soft, hard};
  return setrlimit(resource, &nl);
}

/* Marks every descriptor >= 3 close-on-exec. */
static void child_cloexec_rest(void) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
    return;
#endif
  /* Kernels before 5.11: walk up to the descriptor limit (capped). */
  struct rlimit rl;
  long max = 65536;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < (rlim_t)max)
    max = (long)rl.rlim_cur;
  for (long fd = 3; fd < max; fd++)
    fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* EBADF for the closed ones */
}

static void child_run(const char *const *argv, const ag_rlimits *limits,
                      int cwd_fd, int stdio[3], int status_fd) {
  if (setpgid(0, 0) != 0)
    child_fail(status_fd, STAGE_PGID, errno);
  /* Before the descriptor shuffle, which may reuse cwd_fd's number. */
  if (cwd_fd >= 0 && fchdir(cwd_fd) != 0)
    child_fail(status_fd, STAGE_CWD, errno);

  /* Handlers would be reset by exec anyway, but ignored signals would stay
   * ignored: a tool must start as from a fresh shell. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig != SIGKILL && sig != SIGSTOP)
      sigaction(sig, &dfl, NULL); /* EINVAL for libc's reserved ones */
  }

  /* Lift every source above 2 first, so no dup2 overwrites another source
   * (the parent may have been started with 0, 1 or 2 closed). */
  status_fd = child_lift_fd(status_fd);
  if (status_fd < 0)
    _exit(127);
  for (int i = 0; i < 3; i++) {
    stdio[i] = child_lift_fd(stdio[i]);
    if (stdio[i] < 0)
      child_fail(status_fd, STAGE_STDIO, errno);
  }
  for (int i = 0; i < 3; i++) {
    int r;
    do
      r = dup2(stdio[i], i); /* the copy is not close-on-exec */
    while (r < 0 && errno == EINTR);
    if (r < 0)
      child_fail(status_fd, STAGE_STDIO, errno);
  }
  child_cloexec_rest();

  if (limits != NULL) {
    if (limits->cpu_seconds > 0 &&
        child_set_limit(RLIMIT_CPU, limits->cpu_seconds, 1) != 0)
      child_fail(status_fd, STAGE_RLIMIT, errno);
    if (limits->address_space_bytes > 0 &&
        child_set_limit(RLIMIT_AS, limits->address_space_bytes, 0) != 0)
      child_fail(status_fd, STAGE_RLIMIT, errno);
    if (limits->open_files > 0 &&
        child_set_limit(RLIMIT_NOFILE, limits->open_files, 0) != 0)
      child_fail(status_fd, STAGE_RLIMIT, errno);
  }

  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, NULL);

  execvp(argv[0], (char *const *)argv);
  child_fail(status_fd, STAGE_EXEC, errno);
}

/* ---- the parent --------------------------------------------------------- */

typedef struct child {
  pid_t pid;
  int in_fd, out_fd, err_fd, status_fd, pidfd;
} child;

static int make_pipe(int p[2]) {
  int r;
  do
    r = pipe2(p, O_CLOEXEC);
  while (r < 0 && errno == EINTR);
  return r;
}

/* Forks and execs. Returns 0, or an errno value with nothing left open. */
static int spawn_child(const char *const *argv, const ag_rlimits *limits,
                       int cwd_fd, child *c) {
  int p[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
  int e = 0;
  for (int i = 0; i < 4 && e == 0; i++) {
    if (make_pipe(p[i]) != 0)
      e = errno;
  }
  /* Our ends; the child's ends stay blocking. */
  for (int i = 0; i < 3 && e == 0; i++) {
    if (set_nonblock(i == 0 ? p[0][1] : p[i][0]) != 0)
      e = errno;
  }
  if (e == 0 && set_nonblock(p[3][0]) != 0)
    e = errno;
  if (e != 0) {
    for (int i = 0; i < 4; i++) {
      close_fd(&p[i][0]);
      close_fd(&p[i][1]);
    }
    return e;
  }

  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = fork();
  if (pid == 0) {
    int stdio[3] = {p[0][0], p[1][1], p[2][1]};
    child_run(argv, limits, cwd_fd, stdio, p[3][1]);
    _exit(127); /* not reached */
  }
  e = pid < 0 ? errno : 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  close_fd(&p[0][0]);
  close_fd(&p[1][1]);
  close_fd(&p[2][1]);
  close_fd(&p[3][1]);
  if (pid < 0) {
    close_fd(&p[0][1]);
    close_fd(&p[1][0]);
    close_fd(&p[2][0]);
    close_fd(&p[3][0]);
    return e;
  }
  /* Also here, so the group exists before we might signal it; EACCES once
   * the child has exec'd means it already did this itself. */
  setpgid(pid, pid);

  c->pid = pid;
  c->in_fd = p[0][1];
  c->out_fd = p[1][0];
  c->err_fd = p[2][0];
  c->status_fd = p[3][0];
  c->pidfd = -1;
#ifdef SYS_pidfd_open
  long pfd = syscall(SYS_pidfd_open, (long)pid, 0L); /* always O_CLOEXEC */
  if (pfd >= 0)
    c->pidfd = (int)pfd;
#endif
  return 0;
}

/* Sends sig to the child's group (to the child alone if it has none yet). */
static void signal_group(pid_t pid, int sig) {
  if (kill(-pid, sig) != 0 && errno == ESRCH)
    kill(pid, sig);
}

/* Without a pidfd: whether the child has exited, without reaping it. */
static bool exited_nowait(pid_t pid) {
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  int r;
  do
    r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT);
  while (r < 0 && errno == EINTR);
  if (r < 0)
    return errno == ECHILD; /* reaped by someone else: gone anyway */
  return si.si_pid == pid;
}

/* ---- captured streams --------------------------------------------------- */

typedef struct stream {
  int *fd;
  ag_output *o;   /* NULL: discard */
  size_t limit;   /* keep at most this many bytes in o */
  size_t dropped; /* bytes read past limit */
} stream;

static void stream_init(stream *s, int *fd, ag_output *o) {
  s->fd = fd;
  s->o = o;
  s->dropped = 0;
  s->limit = 0;
  if (o != NULL)
    s->limit =
        o->cap >= 4 * (size_t)MARK_RESERVE ? o->cap - MARK_RESERVE : o->cap;
}

static void stream_keep(stream *s, const char *data, size_t n) {
  size_t have = s->o != NULL ? s->o->len : 0;
  size_t room = s->limit > have ? s->limit - have : 0;
  size_t keep = n < room ? n : room;
  if (keep > 0)
    ag_output_write(s->o, data, keep);
  s->dropped =
      n - keep > SIZE_MAX - s->dropped ? SIZE_MAX : s->dropped + (n - keep);
}

/* Reads what the pipe holds, at most `rounds` reads; closes it at EOF. */
static void stream_read(stream *s, char *buf, int rounds) {
  for (int i = 0; *s->fd >= 0 && i < rounds; i++) {
    ssize_t n = read(*s->fd, buf, READ_CHUNK);
    if (n > 0) {
      stream_keep(s, buf, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    close_fd(s->fd); /* EOF, or an error we cannot do anything about */
  }
}

/* Bytes at the end of buf[0..len) that start a UTF-8 sequence but do not
 * finish it. */
static size_t utf8_incomplete_tail(const char *buf, size_t len) {
  const unsigned char *b = (const unsigned char *)buf;
  size_t back = 0;
  while (back < 4 && back < len && (b[len - 1 - back] & 0xC0) == 0x80)
    back++;
  if (back == len || back == 4)
    return 0; /* no lead byte in reach: not ours to fix */
  unsigned char lead = b[len - 1 - back];
  size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  size_t have = back + 1;
  return want > have && lead >= 0xC0 && lead < 0xF8 ? have : 0;
}

static void stream_finish(stream *s) {
  ag_output *o = s->o;
  if (o == NULL || s->dropped == 0)
    return;
  size_t cut = o->buf != NULL ? utf8_incomplete_tail(o->buf, o->len) : 0;
  if (cut > 0) {
    o->len -= cut;
    o->buf[o->len] = '\0';
  }
  size_t total = s->dropped > SIZE_MAX - cut ? SIZE_MAX : s->dropped + cut;
  char mark[MARK_RESERVE];
  int n = snprintf(mark, sizeof(mark),
                   "\n[output truncated: %zu bytes dropped]", total);
  if (n > 0 && (size_t)n < sizeof(mark) && o->len + (size_t)n <= o->cap)
    ag_output_write(o, mark, (size_t)n);
  o->truncated = true;
  o->dropped = total > SIZE_MAX - o->dropped ? SIZE_MAX : o->dropped + total;
}

/* ---- the run ------------------------------------------------------------ */

static ag_tool_status cancel_status(ag_cancel_reason r) {
  return r == AG_CANCEL_TIMEOUT ? AG_TOOL_TIMEOUT : AG_TOOL_CANCELLED;
}

static void info_reset(ag__proc_info *info) {
  info->exit_code = -1;
  info->term_signal = 0;
  info->exec_failed = false;
  info->exec_errno = 0;
  info->killed = false;
}

static const char *stage_text(int stage) {
  switch (stage) {
  case STAGE_PGID:
    return "cannot start a process group for";
  case STAGE_STDIO:
    return "cannot set up stdin/stdout/stderr for";
  case STAGE_RLIMIT:
    return "cannot apply the resource limits to";
  case STAGE_CWD:
    return "cannot enter the working directory for";
  default:
    return "cannot run";
  }
}

static void write_failure(ag_output *err, const char *what, const char *prog,
                          int e) {
  char buf[128];
  if (err != NULL && err->len == 0)
    ag_output_printf(err, "%s '%s': %s", what, prog,
                     errno_text(e, buf, sizeof(buf)));
}

ag_tool_status ag__subprocess_run(const char *const *argv,
                                  const ag_rlimits *limits,
                                  int64_t kill_grace_ms, const char *input,
                                  size_t input_len, ag_cancel *cancel,
                                  ag_output *out, ag_output *err,
                                  ag__proc_info *info) {
  return ag__subprocess_run_in(-1, argv, limits, kill_grace_ms, input,
                               input_len, cancel, out, err, info);
}

ag_tool_status ag__subprocess_run_in(int cwd_fd, const char *const *argv,
                                     const ag_rlimits *limits,
                                     int64_t kill_grace_ms, const char *input,
                                     size_t input_len, ag_cancel *cancel,
                                     ag_output *out, ag_output *err,
                                     ag__proc_info *info) {
  ag__proc_info local_info;
  if (info == NULL)
    info = &local_info;
  info_reset(info);
  if (argv == NULL || argv[0] == NULL) {
    if (err != NULL && err->len == 0)
      ag_output_printf(err, "cannot run a tool with an empty command");
    info->exec_failed = true;
    info->exec_errno = EINVAL;
    return AG_TOOL_ERROR;
  }
  if (input == NULL)
    input_len = 0;

  ag_cancel_reason reason =
      cancel != NULL ? ag_cancel_check(cancel, ag_now_ms()) : AG_CANCEL_NONE;
  if (reason != AG_CANCEL_NONE)
    return cancel_status(reason); /* nothing started */

  int cfds[CANCEL_FDS];
  int64_t deadline = INT64_MAX;
  size_t ncfds =
      cancel != NULL ? ag_cancel_fds(cancel, cfds, CANCEL_FDS, &deadline) : 0;

  sigpipe_guard sp = {0};
  if (input_len > 0)
    sigpipe_block(&sp);

  child c;
  int e = spawn_child(argv, limits, cwd_fd, &c);
  if (e != 0) {
    sigpipe_restore(&sp);
    info->exec_failed = true;
    info->exec_errno = e;
    write_failure(err, "cannot start", argv[0], e);
    return AG_TOOL_ERROR;
  }

  stream so, se;
  stream_init(&so, &c.out_fd, out);
  stream_init(&se, &c.err_fd, err);
  const char *in_p = input;
  size_t in_left = input_len;
  if (in_left == 0)
    close_fd(&c.in_fd);

  bool exited = false, sent_kill = false;
  int64_t exit_at = 0, kill_at = INT64_MAX;
  int64_t fallback_wait = 1;
  char buf[READ_CHUNK];

  for (;;) {
    int64_t now = ag_now_ms();
    if (exited && c.out_fd < 0 && c.err_fd < 0)
      break; /* finished: a completion seen before a cancel stands */

    if (reason == AG_CANCEL_NONE && cancel != NULL) {
      reason = ag_cancel_check(cancel, now);
      if (reason != AG_CANCEL_NONE) {
        signal_group(c.pid, SIGTERM);
        info->killed = true;
        kill_at = add_ms(now, kill_grace_ms);
        close_fd(&c.in_fd); /* the input no longer matters */
      }
    }
    if (!exited && c.pidfd < 0 && exited_nowait(c.pid)) {
      exited = true;
      exit_at = now;
    }
    if (!sent_kill && (now >= kill_at ||
                       (exited && now >= add_ms(exit_at, ORPHAN_GRACE_MS)))) {
      signal_group(c.pid, SIGKILL);
      sent_kill = true;
    }
    if (sent_kill && exited) {
      /* Whatever still holds the pipes is not coming back: take what is
       * buffered and stop. */
      stream_read(&so, buf, READS_PER_WAKE);
      stream_read(&se, buf, READS_PER_WAKE);
      close_fd(&c.out_fd);
      close_fd(&c.err_fd);
      break;
    }
    if (exited)
      close_fd(&c.in_fd);

    struct pollfd pfd[4 + CANCEL_FDS];
    nfds_t n = 0;
    int i_in = -1, i_out = -1, i_err = -1, i_pid = -1;
    if (c.in_fd >= 0) {
      i_in = (int)n;
      pfd[n++] = (struct pollfd){c.in_fd, POLLOUT, 0};
    }
    if (c.out_fd >= 0) {
      i_out = (int)n;
      pfd[n++] = (struct pollfd){c.out_fd, POLLIN, 0};
    }
    if (c.err_fd >= 0) {
      i_err = (int)n;
      pfd[n++] = (struct pollfd){c.err_fd, POLLIN, 0};
    }
    if (!exited && c.pidfd >= 0) {
      i_pid = (int)n;
      pfd[n++] = (struct pollfd){c.pidfd, POLLIN, 0};
    }
    if (reason == AG_CANCEL_NONE) {
      /* A fired token's eventfd stays readable: only watch it until then. */
      for (size_t k = 0; k < ncfds; k++)
        pfd[n++] = (struct pollfd){cfds[k], POLLIN, 0};
    }

    int64_t wake = INT64_MAX;
    if (reason == AG_CANCEL_NONE) {
      wake = deadline;
      if (ncfds == CANCEL_FDS) /* a longer chain than we watch */
        wake = min64(wake, add_ms(now, 50));
    } else if (!sent_kill) {
      wake = kill_at;
    }
    if (exited && !sent_kill)
      wake = min64(wake, add_ms(exit_at, ORPHAN_GRACE_MS));
    if (!exited && c.pidfd < 0) {
      wake = min64(wake, add_ms(now, fallback_wait));
      fallback_wait = min64(fallback_wait * 2, FALLBACK_MAX_WAIT_MS);
    }
    int timeout = -1;
    if (wake != INT64_MAX)
      timeout = wake <= now ? 0 : (int)min64(wake - now, INT_MAX);

    int r = poll(pfd, n, timeout);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      /* ENOMEM: we cannot watch the child any more; end it. */
      signal_group(c.pid, SIGKILL);
      sent_kill = true;
      exited = true;
      close_fd(&c.out_fd);
      close_fd(&c.err_fd);
      break;
    }
    if (r == 0)
      continue;

    if (i_in >= 0 && pfd[i_in].revents != 0) {
      while (in_left > 0) {
        size_t chunk = in_left < WRITE_CHUNK ? in_left : WRITE_CHUNK;
        ssize_t w = write(c.in_fd, in_p, chunk);
        if (w > 0) {
          in_p += w;
          in_left -= (size_t)w;
          continue;
        }
        if (w < 0 && errno == EINTR)
          continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
          break;
        if (w < 0 && errno == EPIPE)
          sp.raised = true;
        in_left = 0; /* the reader is gone: the rest is not wanted */
      }
      if (in_left == 0)
        close_fd(&c.in_fd);
    }
    if (i_out >= 0 && pfd[i_out].revents != 0)
      stream_read(&so, buf, READS_PER_WAKE);
    if (i_err >= 0 && pfd[i_err].revents != 0)
      stream_read(&se, buf, READS_PER_WAKE);
    if (i_pid >= 0 && pfd[i_pid].revents != 0) {
      exited = true;
      exit_at = ag_now_ms();
    }
  }

  close_fd(&c.in_fd);
  sigpipe_restore(&sp);

  int wstatus = 0;
  pid_t w;
  do
    w = waitpid(c.pid, &wstatus, 0);
  while (w < 0 && errno == EINTR);
  bool have_status = w == c.pid;
  close_fd(&c.pidfd);

  int msg[2] = {0, 0};
  ssize_t got;
  do
    got = read(c.status_fd, msg, sizeof(msg));
  while (got < 0 && errno == EINTR);
  close_fd(&c.status_fd);

  stream_finish(&so);
  stream_finish(&se);

  if (have_status && WIFEXITED(wstatus))
    info->exit_code = WEXITSTATUS(wstatus);
  else if (have_status && WIFSIGNALED(wstatus))
    info->term_signal = WTERMSIG(wstatus);
  if (got == (ssize_t)sizeof(msg)) {
    info->exec_failed = true;
    info->exec_errno = msg[1];
  }

  if (reason != AG_CANCEL_NONE)
    return cancel_status(reason);
  if (info->exec_failed) {
    write_failure(err, stage_text(msg[0]), argv[0], msg[1]);
    return AG_TOOL_ERROR;
  }
  if (!have_status) {
    if (err != NULL && err->len == 0)
      ag_output_printf(err,
                       "exit status of '%s' unavailable (was the child "
                       "reaped elsewhere? SIGCHLD ignored?)",
                       argv[0]);
    return AG_TOOL_ERROR;
  }
  if (info->exit_code == 0)
    return AG_TOOL_OK;
  if (err != NULL && err->len == 0) {
    if (info->exit_code > 0)
      ag_output_printf(err, "exited with status %d", info->exit_code);
    else
      ag_output_printf(err, "killed by signal %d (%s)", info->term_signal,
                       signal_text(info->term_signal));
  }
  return AG_TOOL_ERROR;
}
