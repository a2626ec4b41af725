/*
 * src/exec/subprocess.c - runs a subprocess tool: spawns a per-call
 * supervisor process that forks the tool into its own process group and
 * outlives it (the supervisor's and the tool's side of the fork are in
 * subprocess_supervisor.c), stdin fed from memory, stdout and stderr
 * captured into bounded buffers, the attempt's cancel token watched, and
 * nothing of the tool left running afterwards - not its group, not what
 * left the group, not even when the process running agentguard is SIGKILLed
 * (docs/security.md#processes); and builds the tool's environment
 * (ag__env_build).
 *
 * Processes. runner (the calling thread) -> supervisor (a fork, no exec)
 * -> tool (fork + exec). Why a supervisor, and what it and the tool do after
 * the fork: subprocess_supervisor.c.
 *
 * Spawning (spawn_child). Four pipes, all pipe2(O_CLOEXEC): stdin, stdout,
 * stderr and a status pipe, and the lifeline socketpair. The calling thread
 * blocks every signal around fork() so no handler of the application can
 * run in the supervisor or the tool (subprocess_supervisor.c keeps them
 * blocked in the supervisor and resets them in the tool). A failure of the
 * tool before exec comes back as {stage, errno} on the status pipe; the
 * supervisor writes {AG__MSG_PID, pid} and, at the end, {AG__MSG_EXIT, wait
 * status}.
 *
 * The status pipe is never read with a blocking read: a fork() by another
 * thread of the application between our pipe2() and close() can hold the
 * write end for as long as its child lives. It is read once, non-blocking,
 * after the supervisor has been reaped: by then everything is in it.
 *
 * The loop (run_wait; ag__subprocess_run_in runs spawn_child, run_wait,
 * run_reap and run_result in turn). One poll() over: our stdin write end
 * (POLLOUT while input is left), stdout and stderr read ends, a pidfd of the
 * supervisor (readable when it exits), and the cancel chain's eventfds
 * until the token fires. The poll timeout is the earliest of: the chain's
 * deadline (every LONG_CHAIN_POLL_MS when the chain has more tokens than
 * we watch), the SIGKILL time (and every FORCE_POLL_MS during the grace, to
 * see ag_cancel_force), the orphan grace; after each wake-up
 * ag_cancel_check() decides. All our pipe ends are non-blocking, so input
 * is written in whatever pieces the pipe takes, interleaved with reading: a
 * child that writes a lot before reading its stdin cannot deadlock us. Each
 * stream is read in bounded rounds so one chatty stream cannot starve the
 * other, the stdin writer or the cancel check.
 *
 * Exit detection without SIGCHLD. A library must not install a SIGCHLD
 * handler (the application may own it), and signalfd needs SIGCHLD blocked
 * in every thread. A pidfd (pidfd_open, Linux 5.3) is a pollable, per-child,
 * close-on-exec descriptor: exit wakes the same poll() that watches the
 * pipes, at no cost. Where pidfd_open is missing (ENOSYS, seccomp) the loop
 * falls back to waitid(WNOHANG | WNOWAIT) at an interval of 1 ms doubling to
 * 16 ms. The supervisor, for its part, sees the tool exit through waitid
 * with WNOWAIT, so the tool's pid - and with it its process group id -
 * cannot be reused before the group has been killed.
 *
 * Termination. On cancel: AG__CMD_TERM (the supervisor sends SIGTERM to the
 * tool's group), stdin closed, pipes still drained; at cancel time +
 * kill_grace_ms, or at once after ag_cancel_force, AG__CMD_KILL (SIGKILL to the
 * whole tree). When the supervisor has exited the tree is dead; pipes still
 * open then are held by something that escaped the tree entirely: we wait
 * ORPHAN_GRACE_MS more, read what is already in the pipes and stop.
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
 * every other thread), and the supervisor must be a fork anyway. Also rejected:
 * a SIGCHLD handler or signalfd (the application owns process-wide signal
 * state); a blocking waitpid once the pipes close (a child that closed stdout
 * and kept running would make us deaf to the cancel token).
 *
 * Limits of a library: if the application ignores SIGCHLD (or sets
 * SA_NOCLDWAIT) the kernel reaps the supervisor itself; its status report
 * is still in the pipe (the supervisor resets SIGCHLD for its own
 * children), but our final waitpid() then blocks until every child of the
 * application has exited: ignoring SIGCHLD is not supported. An
 * application thread calling waitpid(-1) can reap a supervisor too; the
 * report still arrives.
 */
#define _GNU_SOURCE /* pipe2, sigdescr_np */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

enum {
  READ_CHUNK = 16384,        /* bytes per read(); a stack buffer */
  READS_PER_WAKE = 16,       /* read() calls per stream per wake-up */
  WRITE_CHUNK = 65536,       /* bytes per write() to stdin */
  ORPHAN_GRACE_MS = 50,      /* pipes open after the child exited */
  MARK_RESERVE = 64,         /* room kept for the truncation mark */
  CANCEL_FDS = 16,           /* eventfds of the cancel chain we poll */
  FALLBACK_MAX_WAIT_MS = 16, /* no pidfd: longest sleep between waitid */
  FORCE_POLL_MS = 20,        /* in the grace: how often to look for a force */
  STATUS_MSGS = 4,           /* 8-byte messages read from the status pipe */
  /* A cancel chain longer than CANCEL_FDS: the tokens we do not watch are
   * looked at (ag_cancel_check) at least this often. */
  LONG_CHAIN_POLL_MS = 50
};

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

/* ---- the tool's environment --------------------------------------------- */

extern char **environ;

/* What every tool gets from agentguard's environment, when set. */
static const char *const base_env[] = {"PATH", "HOME", "LANG", "TERM",
                                       "TMPDIR"};
#define N_BASE_ENV (sizeof(base_env) / sizeof(base_env[0]))

bool ag__env_entry_valid(const char *entry, size_t *name_len) {
  if (entry == NULL)
    return false;
  size_t i = 0;
  for (; entry[i] != '\0' && entry[i] != '='; i++) {
    char ch = entry[i];
    bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
              ch == '_' || (i > 0 && ch >= '0' && ch <= '9');
    if (!ok || i >= AG__ENV_NAME_MAX)
      return false;
  }
  if (name_len != NULL)
    *name_len = i;
  return i > 0;
}

typedef struct env_item {
  const char *name; /* not NUL-terminated at name_len */
  size_t name_len;
  const char *value; /* NUL-terminated */
} env_item;

/* Sets name=value in items (replacing an earlier entry of that name). */
static void env_put(env_item *items, size_t *n, const char *name,
                    size_t name_len, const char *value) {
  for (size_t i = 0; i < *n; i++) {
    if (items[i].name_len == name_len &&
        memcmp(items[i].name, name, name_len) == 0) {
      items[i].value = value;
      return;
    }
  }
  items[*n].name = name;
  items[*n].name_len = name_len;
  items[*n].value = value;
  (*n)++;
}

/* The process's value of name[0..len), or NULL. */
static const char *env_lookup(const char *name, size_t len) {
  for (char **e = environ; e != NULL && *e != NULL; e++) {
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
      return *e + len + 1;
  }
  return NULL;
}

ag_err_t ag__env_build(const char *const *extra, bool inherit, char ***out) {
  *out = NULL;
  size_t n_inherit = 0, n_extra = 0;
  if (inherit)
    for (char **e = environ; e != NULL && *e != NULL; e++)
      n_inherit++;
  if (extra != NULL)
    while (extra[n_extra] != NULL)
      n_extra++;
  size_t cap = (inherit ? n_inherit : N_BASE_ENV) + n_extra;
  env_item *items = malloc((cap > 0 ? cap : 1) * sizeof(*items));
  if (items == NULL)
    return AG_ENOMEM;
  size_t n = 0;
  if (inherit) {
    for (char **e = environ; e != NULL && *e != NULL; e++) {
      const char *eq = strchr(*e, '=');
      if (eq != NULL && eq > *e)
        env_put(items, &n, *e, (size_t)(eq - *e), eq + 1);
    }
  } else {
    for (size_t i = 0; i < N_BASE_ENV; i++) {
      size_t len = strlen(base_env[i]);
      const char *v = env_lookup(base_env[i], len);
      if (v != NULL)
        env_put(items, &n, base_env[i], len, v);
    }
  }
  for (size_t i = 0; i < n_extra; i++) {
    size_t len;
    if (!ag__env_entry_valid(extra[i], &len))
      continue; /* the registry refused these already */
    const char *v =
        extra[i][len] == '=' ? extra[i] + len + 1 : env_lookup(extra[i], len);
    if (v != NULL)
      env_put(items, &n, extra[i], len, v);
  }
  size_t bytes = (n + 1) * sizeof(char *);
  for (size_t i = 0; i < n; i++)
    bytes += items[i].name_len + 1 + strlen(items[i].value) + 1;
  char **envp = malloc(bytes);
  if (envp == NULL) {
    free(items);
    return AG_ENOMEM;
  }
  char *p = (char *)(envp + n + 1);
  for (size_t i = 0; i < n; i++) {
    envp[i] = p;
    memcpy(p, items[i].name, items[i].name_len);
    p += items[i].name_len;
    *p++ = '=';
    size_t vl = strlen(items[i].value);
    memcpy(p, items[i].value, vl + 1);
    p += vl + 1;
  }
  envp[n] = NULL;
  free(items);
  *out = envp;
  return AG_OK;
}

/* ---- the parent --------------------------------------------------------- */

typedef struct child {
  pid_t pid; /* the supervisor */
  int in_fd, out_fd, err_fd, status_fd, life_fd, pidfd;
} child;

static int make_pipe(int p[2]) {
  int r;
  do
    r = pipe2(p, O_CLOEXEC);
  while (r < 0 && errno == EINTR);
  return r;
}

/* Forks the supervisor, which forks and execs the tool. Returns 0, or an
 * errno value with nothing left open. */
static int spawn_child(const char *const *argv, const ag_rlimits *limits,
                       char *const *envp, int cwd_fd, child *c) {
  int p[5][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
  int e = 0;
  for (int i = 0; i < 4 && e == 0; i++) {
    if (make_pipe(p[i]) != 0)
      e = errno;
  }
  /* The lifeline is a socket so that a command sent after the supervisor
   * died is EPIPE without SIGPIPE (send with MSG_NOSIGNAL). */
  if (e == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p[4]) != 0)
    e = errno;
  /* Our ends; the child's ends stay blocking. */
  for (int i = 0; i < 3 && e == 0; i++) {
    if (set_nonblock(i == 0 ? p[0][1] : p[i][0]) != 0)
      e = errno;
  }
  if (e == 0 && (set_nonblock(p[3][0]) != 0 || set_nonblock(p[4][1]) != 0))
    e = errno;
  if (e != 0) {
    for (int i = 0; i < 5; i++) {
      close_fd(&p[i][0]);
      close_fd(&p[i][1]);
    }
    return e;
  }

  pid_t runner = getpid();
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = fork();
  if (pid == 0) {
    int stdio[3] = {p[0][0], p[1][1], p[2][1]};
    ag__supervisor_run(argv, limits, envp, cwd_fd, stdio, p[3][1], p[4][0],
                       runner);
    _exit(127); /* not reached */
  }
  e = pid < 0 ? errno : 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  close_fd(&p[0][0]);
  close_fd(&p[1][1]);
  close_fd(&p[2][1]);
  close_fd(&p[3][1]);
  close_fd(&p[4][0]);
  if (pid < 0) {
    close_fd(&p[0][1]);
    close_fd(&p[1][0]);
    close_fd(&p[2][0]);
    close_fd(&p[3][0]);
    close_fd(&p[4][1]);
    return e;
  }

  c->pid = pid;
  c->in_fd = p[0][1];
  c->out_fd = p[1][0];
  c->err_fd = p[2][0];
  c->status_fd = p[3][0];
  c->life_fd = p[4][1];
  c->pidfd = -1;
#ifdef SYS_pidfd_open
  long pfd = syscall(SYS_pidfd_open, (long)pid, 0L); /* always O_CLOEXEC */
  if (pfd >= 0)
    c->pidfd = (int)pfd;
#endif
  return 0;
}

/* Sends a command to the supervisor; a dead supervisor needs none. */
static void send_cmd(child *c, char cmd) {
  if (c->life_fd < 0)
    return;
  ssize_t r;
  do
    r = send(c->life_fd, &cmd, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
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

static void stream_finish(stream *s) {
  ag_output *o = s->o;
  if (o == NULL || s->dropped == 0)
    return;
  size_t cut = o->buf != NULL ? ag__utf8_incomplete_tail(o->buf, o->len) : 0;
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
  case AG__STAGE_PGID:
    return "cannot start a process group for";
  case AG__STAGE_STDIO:
    return "cannot set up stdin/stdout/stderr for";
  case AG__STAGE_RLIMIT:
    return "cannot apply the resource limits to";
  case AG__STAGE_SUPERVISOR:
    return "cannot start the supervisor of";
  case AG__STAGE_CWD:
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
  return ag__subprocess_run_in(-1, argv, limits, NULL, kill_grace_ms, input,
                               input_len, cancel, out, err, info);
}

ag_tool_status ag__subprocess_run_env(const char *const *argv,
                                      const ag_rlimits *limits,
                                      char *const *envp, int64_t kill_grace_ms,
                                      const char *input, size_t input_len,
                                      ag_cancel *cancel, ag_output *out,
                                      ag_output *err, ag__proc_info *info) {
  return ag__subprocess_run_in(-1, argv, limits, envp, kill_grace_ms, input,
                               input_len, cancel, out, err, info);
}

/* One run's state, shared by the steps of ag__subprocess_run_in. The streams
 * point into `c`, so a run_state is never copied. */
typedef struct run_state {
  child c;
  stream so, se;
  sigpipe_guard sp;
  ag_cancel *cancel; /* NULL: nothing to watch */
  int64_t kill_grace_ms;
  ag__proc_info *info;
  const char *in_p; /* input not yet written */
  size_t in_left;
  int cfds[CANCEL_FDS]; /* the cancel chain's eventfds */
  size_t ncfds;
  int64_t deadline; /* the chain's earliest deadline */
  ag_cancel_reason reason;
  /* `exited`: the supervisor exited, i.e. the tool exited and every process
   * of its tree is dead and reaped (or the supervisor was killed). */
  bool exited, sent_kill;
  int64_t exit_at, kill_at;
  int64_t fallback_wait; /* no pidfd: the next sleep between waitid() */
} run_state;

/* The descriptors of one poll(): where each of ours sits, -1 if unwatched. */
typedef struct poll_set {
  struct pollfd pfd[4 + CANCEL_FDS];
  nfds_t n;
  int i_in, i_out, i_err, i_pid;
} poll_set;

/* What the supervisor left behind: its own wait status and its messages. */
typedef struct sup_report {
  pid_t waited; /* waitpid()'s answer for the supervisor */
  int sup_status;
  bool have_status; /* AG__MSG_EXIT came: wstatus is the tool's */
  int wstatus;
  int stage, stage_errno; /* the first failure before exec, 0 if none */
  pid_t tool;             /* from AG__MSG_PID, 0 if never forked */
} sup_report;

/* Acts on the clock and the token before the next wait: SIGTERM on cancel,
 * SIGKILL when the grace ends, an exit noticed without a pidfd. Returns true
 * when the run is over (finished, or the orphan grace ran out). */
static bool run_decide(run_state *r, int64_t now, char *buf) {
  if (r->exited && r->c.out_fd < 0 && r->c.err_fd < 0)
    return true; /* finished: a completion seen before a cancel stands */

  if (r->reason == AG_CANCEL_NONE && r->cancel != NULL) {
    r->reason = ag_cancel_check(r->cancel, now);
    if (r->reason != AG_CANCEL_NONE) {
      send_cmd(&r->c, AG__CMD_TERM);
      r->info->killed = true;
      r->kill_at = add_ms(now, r->kill_grace_ms);
      close_fd(&r->c.in_fd); /* the input no longer matters */
    }
  }
  if (r->reason != AG_CANCEL_NONE && !r->sent_kill &&
      ag__cancel_forced(r->cancel))
    r->kill_at = now; /* a second Ctrl-C: no grace */
  if (!r->exited && r->c.pidfd < 0 && exited_nowait(r->c.pid)) {
    r->exited = true;
    r->exit_at = now;
  }
  if (!r->sent_kill && !r->exited && now >= r->kill_at) {
    send_cmd(&r->c, AG__CMD_KILL);
    r->sent_kill = true;
  }
  if (r->exited && now >= add_ms(r->exit_at, ORPHAN_GRACE_MS)) {
    /* Every process of the tree is gone; whatever still holds the pipes
     * escaped it (see docs/security.md). Take what is buffered and stop. */
    stream_read(&r->so, buf, READS_PER_WAKE);
    stream_read(&r->se, buf, READS_PER_WAKE);
    close_fd(&r->c.out_fd);
    close_fd(&r->c.err_fd);
    return true;
  }
  if (r->exited)
    close_fd(&r->c.in_fd);
  return false;
}

/* Fills `ps` with what the next poll() watches. */
static void run_watch(const run_state *r, poll_set *ps) {
  ps->n = 0;
  ps->i_in = ps->i_out = ps->i_err = ps->i_pid = -1;
  if (r->c.in_fd >= 0) {
    ps->i_in = (int)ps->n;
    ps->pfd[ps->n++] = (struct pollfd){r->c.in_fd, POLLOUT, 0};
  }
  if (r->c.out_fd >= 0) {
    ps->i_out = (int)ps->n;
    ps->pfd[ps->n++] = (struct pollfd){r->c.out_fd, POLLIN, 0};
  }
  if (r->c.err_fd >= 0) {
    ps->i_err = (int)ps->n;
    ps->pfd[ps->n++] = (struct pollfd){r->c.err_fd, POLLIN, 0};
  }
  if (!r->exited && r->c.pidfd >= 0) {
    ps->i_pid = (int)ps->n;
    ps->pfd[ps->n++] = (struct pollfd){r->c.pidfd, POLLIN, 0};
  }
  if (r->reason == AG_CANCEL_NONE) {
    /* A fired token's eventfd stays readable: only watch it until then. */
    for (size_t k = 0; k < r->ncfds; k++)
      ps->pfd[ps->n++] = (struct pollfd){r->cfds[k], POLLIN, 0};
  }
}

/* The next poll()'s timeout in ms (-1: none): the earliest of the token's
 * deadline, the SIGKILL time, the orphan grace and the no-pidfd interval,
 * which doubles here. */
static int run_timeout(run_state *r, int64_t now) {
  int64_t wake = INT64_MAX;
  if (r->reason == AG_CANCEL_NONE) {
    wake = r->deadline;
    if (r->ncfds == CANCEL_FDS) /* a longer chain than we watch */
      wake = min64(wake, add_ms(now, LONG_CHAIN_POLL_MS));
  } else if (!r->sent_kill && !r->exited) {
    /* In the grace: until SIGKILL, looking for a force meanwhile. */
    wake = min64(r->kill_at, add_ms(now, FORCE_POLL_MS));
  }
  if (r->exited)
    wake = min64(wake, add_ms(r->exit_at, ORPHAN_GRACE_MS));
  if (!r->exited && r->c.pidfd < 0) {
    wake = min64(wake, add_ms(now, r->fallback_wait));
    r->fallback_wait = min64(r->fallback_wait * 2, FALLBACK_MAX_WAIT_MS);
  }
  if (wake == INT64_MAX)
    return -1;
  return wake <= now ? 0 : (int)min64(wake - now, INT_MAX);
}

/* Writes as much input as the pipe takes now; closes stdin when all is
 * written or the reader is gone (then the rest is not wanted). */
static void run_feed(run_state *r) {
  while (r->in_left > 0) {
    size_t chunk = r->in_left < WRITE_CHUNK ? r->in_left : WRITE_CHUNK;
    ssize_t w = write(r->c.in_fd, r->in_p, chunk);
    if (w > 0) {
      r->in_p += w;
      r->in_left -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (w < 0 && errno == EPIPE)
      r->sp.raised = true;
    r->in_left = 0;
  }
  if (r->in_left == 0)
    close_fd(&r->c.in_fd);
}

/* Serves what poll() reported ready in `ps`. */
static void run_serve(run_state *r, const poll_set *ps, char *buf) {
  if (ps->i_in >= 0 && ps->pfd[ps->i_in].revents != 0)
    run_feed(r);
  if (ps->i_out >= 0 && ps->pfd[ps->i_out].revents != 0)
    stream_read(&r->so, buf, READS_PER_WAKE);
  if (ps->i_err >= 0 && ps->pfd[ps->i_err].revents != 0)
    stream_read(&r->se, buf, READS_PER_WAKE);
  if (ps->i_pid >= 0 && ps->pfd[ps->i_pid].revents != 0) {
    r->exited = true;
    r->exit_at = ag_now_ms();
  }
}

/* The wait loop: feeds stdin, drains stdout and stderr and watches the
 * supervisor and the token until the run is over. */
static void run_wait(run_state *r) {
  char buf[READ_CHUNK];
  for (;;) {
    int64_t now = ag_now_ms();
    if (run_decide(r, now, buf))
      return;
    poll_set ps;
    run_watch(r, &ps);
    int timeout = run_timeout(r, now);
    int n = poll(ps.pfd, ps.n, timeout);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      /* ENOMEM: we cannot watch the tool any more; end it. Closing the
       * lifeline makes the supervisor kill the tree and exit. */
      send_cmd(&r->c, AG__CMD_KILL);
      r->sent_kill = true;
      r->exited = true;
      close_fd(&r->c.out_fd);
      close_fd(&r->c.err_fd);
      return;
    }
    if (n > 0)
      run_serve(r, &ps, buf);
  }
}

/* Ends the run's side of the processes: closes stdin and the lifeline (the
 * last word: a supervisor still running - only after poll failed - kills
 * the tree and exits), reaps the supervisor and reads its report. */
static void run_reap(run_state *r, sup_report *rep) {
  close_fd(&r->c.in_fd);
  sigpipe_restore(&r->sp);
  close_fd(&r->c.life_fd);
  memset(rep, 0, sizeof(*rep));
  do
    rep->waited = waitpid(r->c.pid, &rep->sup_status, 0);
  while (rep->waited < 0 && errno == EINTR);
  close_fd(&r->c.pidfd);

  int msg[STATUS_MSGS][2];
  ssize_t got;
  do
    got = read(r->c.status_fd, msg, sizeof(msg));
  while (got < 0 && errno == EINTR);
  close_fd(&r->c.status_fd);

  for (ssize_t k = 0; got > 0 && k < got / (ssize_t)sizeof(msg[0]); k++) {
    if (msg[k][0] == AG__MSG_EXIT) {
      rep->have_status = true;
      rep->wstatus = msg[k][1];
    } else if (msg[k][0] == AG__MSG_PID) {
      rep->tool = (pid_t)msg[k][1];
    } else if (rep->stage == 0) {
      rep->stage = msg[k][0];
      rep->stage_errno = msg[k][1];
    }
  }
  if (!rep->have_status && rep->tool > 0) {
    /* The supervisor died without a word: someone killed it. The tool died
     * with it (its parent-death signal); its group may not have. */
    kill(-rep->tool, SIGKILL);
  }
}

/* Turns the report into `info`, the status and, when stderr is empty, a
 * message saying what happened. */
static ag_tool_status run_result(const run_state *r, const sup_report *rep,
                                 const char *prog, ag_output *err) {
  ag__proc_info *info = r->info;
  if (rep->have_status && WIFEXITED(rep->wstatus))
    info->exit_code = WEXITSTATUS(rep->wstatus);
  else if (rep->have_status && WIFSIGNALED(rep->wstatus))
    info->term_signal = WTERMSIG(rep->wstatus);
  if (rep->stage != 0) {
    info->exec_failed = true;
    info->exec_errno = rep->stage_errno;
  }

  if (r->reason != AG_CANCEL_NONE)
    return cancel_status(r->reason);
  if (info->exec_failed) {
    write_failure(err, stage_text(rep->stage), prog, rep->stage_errno);
    return AG_TOOL_ERROR;
  }
  if (!rep->have_status) {
    if (err != NULL && err->len == 0) {
      if (rep->waited == r->c.pid && WIFSIGNALED(rep->sup_status))
        ag_output_printf(err,
                         "the supervisor of '%s' was killed by signal %d "
                         "(%s); the tool was killed with it",
                         prog, WTERMSIG(rep->sup_status),
                         signal_text(WTERMSIG(rep->sup_status)));
      else
        ag_output_printf(err,
                         "exit status of '%s' unavailable (was the child "
                         "reaped elsewhere? SIGCHLD ignored?)",
                         prog);
    }
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

ag_tool_status ag__subprocess_run_in(int cwd_fd, const char *const *argv,
                                     const ag_rlimits *limits,
                                     char *const *envp, int64_t kill_grace_ms,
                                     const char *input, size_t input_len,
                                     ag_cancel *cancel, ag_output *out,
                                     ag_output *err, ag__proc_info *info) {
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

  run_state r;
  memset(&r, 0, sizeof(r));
  r.cancel = cancel;
  r.kill_grace_ms = kill_grace_ms;
  r.info = info;
  r.reason = AG_CANCEL_NONE;
  r.deadline = INT64_MAX;
  r.kill_at = INT64_MAX;
  r.fallback_wait = 1;
  if (cancel != NULL)
    r.ncfds = ag_cancel_fds(cancel, r.cfds, CANCEL_FDS, &r.deadline);

  if (input_len > 0)
    sigpipe_block(&r.sp);
  int e = spawn_child(argv, limits, envp, cwd_fd, &r.c);
  if (e != 0) {
    sigpipe_restore(&r.sp);
    info->exec_failed = true;
    info->exec_errno = e;
    write_failure(err, "cannot start", argv[0], e);
    return AG_TOOL_ERROR;
  }

  stream_init(&r.so, &r.c.out_fd, out);
  stream_init(&r.se, &r.c.err_fd, err);
  r.in_p = input;
  r.in_left = input_len;
  if (r.in_left == 0)
    close_fd(&r.c.in_fd);

  run_wait(&r);
  sup_report rep;
  run_reap(&r, &rep);
  stream_finish(&r.so);
  stream_finish(&r.se);
  return run_result(&r, &rep, argv[0], err);
}
