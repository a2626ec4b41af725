/*
 * src/exec/subprocess_supervisor.c - the subprocess tool's side of the fork
 * (ag__supervisor_run): the per-call supervisor process, which forks the
 * tool into its own process group, passes the runner's SIGTERM on to that
 * group, and kills and reaps the tool's whole tree when the tool exits, the
 * runner says so or the runner's process dies; and the tool's steps between
 * fork and exec. subprocess.c spawns the supervisor and runs the call
 * (pipes, the wait loop, captured output, the result); the status pipe's
 * messages and the lifeline's commands are in internal.h.
 *
 * Processes. runner (the calling thread) -> supervisor (a fork, no exec)
 * -> tool (fork + exec). The supervisor is a child subreaper
 * (PR_SET_CHILD_SUBREAPER): every process the tool starts and abandons -
 * a background job, a double fork, a setsid daemon - is re-parented to it,
 * not to init, so it can be found (/proc/self/task/<tid>/children, or a
 * /proc scan) and killed. It kills the whole tree, reaps it and reports the
 * tool's wait status when (1) the tool exits, (2) the runner sends AG__CMD_KILL
 * (the grace after SIGTERM ran out, or ag_cancel_force), (3) the lifeline
 * reaches EOF or its parent-death signal (SIGHUP) comes: the runner's
 * process is gone, however it died. The lifeline is a socketpair whose
 * runner end exists only in the runner's process (close-on-exec; the
 * supervisor closes every descriptor it does not need), so EOF is the
 * kernel's word that the runner died. The tool has PR_SET_PDEATHSIG =
 * SIGKILL on the supervisor (checked against getppid() for the race with
 * an early death), so a killed supervisor takes the tool with it.
 * Rejected: PR_SET_CHILD_SUBREAPER on the application's own process (a
 * library must not make the application the parent of every orphan of
 * every thread, nor reap for it); cgroups (need a writable cgroup v2
 * delegation, which a library cannot count on; docs/security.md says what
 * that leaves); PR_SET_PDEATHSIG alone (it reaches only the direct child).
 *
 * After the fork. The runner's thread blocked every signal around fork();
 * the supervisor keeps them all blocked and reads SIGCHLD and SIGHUP from a
 * signalfd (it is single-threaded, and its signal state is its own), so a
 * terminal's Ctrl-C never reaches it: the runner decides. The supervisor and
 * the tool make only async-signal-safe calls (raw syscalls on stack buffers,
 * no malloc) - they are forks of a possibly multi-threaded process. The
 * tool, between fork and exec: starts its own process group, resets every
 * signal disposition to the default and unblocks the mask, moves the pipe
 * ends onto 0/1/2, marks every other inherited descriptor close-on-exec (a
 * tool gets exactly stdin, stdout and stderr, like Python's
 * close_fds=True), applies the rlimits and execs (execvpe with the
 * environment ag__env_build made before the fork, or execvp; glibc's PATH
 * search uses the stack). A failure on that path writes {stage, errno} (8
 * bytes, atomic on a pipe) to the status pipe and _exit(127)s; the
 * supervisor writes {AG__MSG_PID, pid} and, at the end, {AG__MSG_EXIT, wait
 * status}.
 */
#define _GNU_SOURCE /* close_range flags, NSIG, execvpe */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

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

/* The descriptors a walk without close_range(2) visits (kernels before
 * 5.11): below the descriptor limit, and at most 65536 of them. */
static int fd_walk_limit(void) {
  struct rlimit rl;
  int max = 65536;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      rl.rlim_cur < (rlim_t)max)
    max = (int)rl.rlim_cur;
  return max;
}

/* Marks every descriptor >= 3 close-on-exec. */
static void child_cloexec_rest(void) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
    return;
#endif
  for (int fd = 3, max = fd_walk_limit(); fd < max; fd++)
    fcntl(fd, F_SETFD, FD_CLOEXEC); /* EBADF for the closed ones */
}

static void child_run(const char *const *argv, const ag_rlimits *limits,
                      char *const *envp, int stdio[3], int status_fd,
                      pid_t supervisor) {
  /* Die with the supervisor, whatever kills it; if it is already gone the
   * signal was missed, so look. */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != supervisor)
    _exit(127);
  if (setpgid(0, 0) != 0)
    child_fail(status_fd, AG__STAGE_PGID, errno);

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
      child_fail(status_fd, AG__STAGE_STDIO, errno);
  }
  for (int i = 0; i < 3; i++) {
    int r;
    do
      r = dup2(stdio[i], i); /* the copy is not close-on-exec */
    while (r < 0 && errno == EINTR);
    if (r < 0)
      child_fail(status_fd, AG__STAGE_STDIO, errno);
  }
  child_cloexec_rest();

  if (limits != NULL) {
    if (limits->cpu_seconds > 0 &&
        child_set_limit(RLIMIT_CPU, limits->cpu_seconds, 1) != 0)
      child_fail(status_fd, AG__STAGE_RLIMIT, errno);
    if (limits->address_space_bytes > 0 &&
        child_set_limit(RLIMIT_AS, limits->address_space_bytes, 0) != 0)
      child_fail(status_fd, AG__STAGE_RLIMIT, errno);
    if (limits->open_files > 0 &&
        child_set_limit(RLIMIT_NOFILE, limits->open_files, 0) != 0)
      child_fail(status_fd, AG__STAGE_RLIMIT, errno);
  }

  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, NULL);

  if (envp != NULL)
    execvpe(argv[0], (char *const *)argv, envp);
  else
    execvp(argv[0], (char *const *)argv);
  child_fail(status_fd, AG__STAGE_EXEC, errno);
}

/* ---- the supervisor, between the runner and the tool -------------------- */

/*
 * Everything here runs in a forked copy of a possibly multi-threaded
 * process, so it makes only async-signal-safe calls: raw syscalls on stack
 * buffers, no malloc, no stdio.
 */

static void sup_write_msg(int fd, int kind, int value) {
  int msg[2] = {kind, value};
  ssize_t r;
  do
    r = write(fd, msg, sizeof(msg));
  while (r < 0 && errno == EINTR);
}

/* Closes every descriptor but the `n` in keep[] (ascending). */
static void sup_close_others(const int *keep, int n) {
  int lo = 0;
  for (int i = 0; i <= n; i++) {
    int hi = i < n ? keep[i] - 1 : INT_MAX;
    if (hi >= lo) {
#ifdef SYS_close_range
      if (syscall(SYS_close_range, (unsigned)lo, (unsigned)hi, 0U) == 0) {
        lo = i < n ? keep[i] + 1 : lo;
        continue;
      }
#endif
      for (int fd = lo, max = fd_walk_limit(); fd <= hi && fd < max; fd++)
        close(fd);
    }
    if (i < n)
      lo = keep[i] + 1;
  }
}

static int sup_open(const char *path, int flags) {
  int fd;
  do
    fd = open(path, flags | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  return fd;
}

/* Writes the decimal digits of v (> 0) at p; returns the end. */
static char *sup_utoa(char *p, unsigned long v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0)
    *p++ = tmp[--n];
  return p;
}

/*
 * SIGKILLs every child of this process listed in /proc/self/task/<tid>/
 * children (the tool, and every orphan of its tree re-parented to us as
 * the subreaper). Returns how many were signalled, or -1 when the list
 * cannot be read (no /proc, or a kernel without CONFIG_PROC_CHILDREN); then
 * sup_kill_by_scan is tried.
 */
static int sup_kill_children(void) {
  char path[64] = "/proc/self/task/";
  char *p = sup_utoa(path + strlen(path), (unsigned long)getpid());
  memcpy(p, "/children", sizeof("/children"));
  int fd = sup_open(path, O_RDONLY);
  if (fd < 0)
    return -1;
  char buf[512];
  unsigned long pid = 0;
  bool in_num = false;
  int n = 0;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      close(fd);
      return n > 0 ? n : -1;
    }
    for (ssize_t i = 0; i <= r; i++) {
      bool digit = i < r && buf[i] >= '0' && buf[i] <= '9';
      if (digit) {
        pid = pid * 10 + (unsigned long)(buf[i] - '0');
        in_num = true;
      } else if (in_num && (i < r || r == 0)) {
        kill((pid_t)pid, SIGKILL);
        n++;
        pid = 0;
        in_num = false;
      }
    }
    if (r == 0)
      break;
  }
  close(fd);
  return n;
}

/* The same over every /proc/<pid>/stat whose parent is us. Returns how many
 * were signalled, or -1 without /proc. */
static int sup_kill_by_scan(void) {
  int dfd = sup_open("/proc", O_RDONLY | O_DIRECTORY);
  if (dfd < 0)
    return -1;
  pid_t self = getpid();
  char ents[4096];
  int n = 0;
  for (;;) {
    long got = syscall(SYS_getdents64, dfd, ents, sizeof(ents));
    if (got <= 0)
      break;
    for (long off = 0; off < got;) {
      /* struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name */
      unsigned short reclen;
      memcpy(&reclen, ents + off + 16, sizeof(reclen));
      const char *name = ents + off + 19;
      off += reclen;
      if (name[0] < '1' || name[0] > '9')
        continue;
      char path[64] = "/proc/";
      size_t k = strlen(path);
      for (size_t j = 0; name[j] != '\0' && k < 40; j++)
        path[k++] = name[j];
      memcpy(path + k, "/stat", sizeof("/stat"));
      int fd = sup_open(path, O_RDONLY);
      if (fd < 0)
        continue;
      char st[512];
      ssize_t r;
      do
        r = read(fd, st, sizeof(st) - 1);
      while (r < 0 && errno == EINTR);
      close(fd);
      if (r <= 0)
        continue;
      st[r] = '\0';
      /* "pid (comm) S ppid ...": comm may hold anything, so the last ')'. */
      char *rp = NULL;
      for (ssize_t j = 0; j < r; j++)
        if (st[j] == ')')
          rp = st + j;
      if (rp == NULL || rp[1] != ' ' || rp[2] == '\0' || rp[3] != ' ')
        continue;
      unsigned long ppid = 0;
      for (const char *q = rp + 4; *q >= '0' && *q <= '9'; q++)
        ppid = ppid * 10 + (unsigned long)(*q - '0');
      if (ppid == (unsigned long)self) {
        unsigned long pid = 0;
        for (const char *q = name; *q >= '0' && *q <= '9'; q++)
          pid = pid * 10 + (unsigned long)(*q - '0');
        kill((pid_t)pid, SIGKILL);
        n++;
      }
    }
  }
  close(dfd);
  return n;
}

/*
 * Kills the tool's whole tree and reaps it: SIGKILL to the tool's group
 * (while the tool is unreaped its pid keeps the group id from being
 * reused), then rounds of SIGKILL to every child we have - orphans that
 * left the group, even with setsid, were re-parented to us - and a
 * blocking reap, until no child is left. Killing a process hands its own
 * children to us, so the rounds go down the tree. *tool_status gets the
 * tool's wait status when it is reaped here.
 */
static void sup_kill_tree(pid_t tool, bool *tool_reaped, int *tool_status) {
  bool enumerable = true;
  for (;;) {
    if (!*tool_reaped)
      kill(-tool, SIGKILL);
    if (enumerable) {
      int k = sup_kill_children();
      if (k < 0)
        k = sup_kill_by_scan();
      enumerable = k >= 0;
    }
    int ws = 0;
    pid_t w;
    /* Without a way to list our children a blocking wait could wait for a
     * re-parented process nobody killed: only reap what is dead. */
    do
      w = waitpid(-1, &ws, enumerable || !*tool_reaped ? 0 : WNOHANG);
    while (w < 0 && errno == EINTR);
    if (w == tool) {
      *tool_reaped = true;
      *tool_status = ws;
    }
    if (w < 0 || (w == 0 && !enumerable))
      return; /* ECHILD: nothing left */
  }
}

/*
 * fork() from the supervisor. glibc's fork() runs the application's
 * pthread_atfork handlers, which may take locks another thread of the
 * original process held when the supervisor was forked: they would never
 * be released here. _Fork (glibc 2.34, async-signal-safe) runs none.
 * Sanitizer builds keep fork(): their runtimes must see every fork.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SUP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SUP_SANITIZED 1
#endif
#endif

static pid_t sup_fork(void) {
#if defined(__GLIBC__) &&                                                      \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34)) &&            \
    !defined(SUP_SANITIZED)
  return _Fork();
#else
  return fork();
#endif
}

/*
 * The supervisor's first steps: the parent-death signal, the working
 * directory, the subreaper flag, SIGCHLD and SIGHUP back to their defaults,
 * every descriptor but `keep` closed, and the signalfd for SIGCHLD and
 * SIGHUP. Returns the signalfd; on failure reports it and exits.
 */
static int sup_setup(int cwd_fd, int stdio[3], int status_fd, int life_fd,
                     pid_t runner) {
  prctl(PR_SET_PDEATHSIG, SIGHUP, 0, 0, 0);
  if (getppid() != runner)
    _exit(127); /* the runner is already gone: start nothing */
  /* A run with a working directory (ag__subprocess_run_in): the supervisor
   * enters it, so the tool starts there; before the descriptors close. */
  if (cwd_fd >= 0 && fchdir(cwd_fd) != 0) {
    sup_write_msg(status_fd, AG__STAGE_CWD, errno);
    _exit(127);
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    sup_write_msg(status_fd, AG__STAGE_SUPERVISOR, errno);
    _exit(127);
  }
  /* An application that ignores SIGCHLD would have our children reaped
   * behind our back, and one run under nohup would discard our
   * parent-death signal: both back to the default (they stay blocked and
   * are read from the signalfd). */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, NULL);
  sigaction(SIGHUP, &dfl, NULL);

  int keep[5] = {stdio[0], stdio[1], stdio[2], status_fd, life_fd};
  for (int i = 1; i < 5; i++) /* insertion sort: five numbers */
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  sup_close_others(keep, 5);

  sigset_t watch;
  sigemptyset(&watch);
  sigaddset(&watch, SIGCHLD);
  sigaddset(&watch, SIGHUP);
  int sfd = signalfd(-1, &watch, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    sup_write_msg(status_fd, AG__STAGE_SUPERVISOR, errno);
    _exit(127);
  }
  return sfd;
}

/* Forks the tool into its own group and reports its pid; the supervisor
 * then closes its copies of the tool's stdio. On failure reports and exits. */
static pid_t sup_start_tool(const char *const *argv, const ag_rlimits *limits,
                            char *const *envp, int stdio[3], int status_fd,
                            int life_fd, int sfd) {
  pid_t self = getpid();
  pid_t tool = sup_fork();
  if (tool == 0) {
    close(sfd);
    close(life_fd);
    child_run(argv, limits, envp, stdio, status_fd, self);
    _exit(127); /* not reached */
  }
  if (tool < 0) {
    sup_write_msg(status_fd, AG__STAGE_SUPERVISOR, errno);
    _exit(127);
  }
  setpgid(tool, tool); /* also here, so the group exists before a kill */
  sup_write_msg(status_fd, AG__MSG_PID, (int)tool);
  for (int i = 0; i < 3; i++)
    close(stdio[i]);
  return tool;
}

/* Reaps re-parented orphans that died on their own, never the tool. */
static void sup_reap_orphans(pid_t tool) {
  for (;;) {
    siginfo_t wi;
    memset(&wi, 0, sizeof(wi));
    if (waitid(P_ALL, 0, &wi, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        wi.si_pid == 0 || wi.si_pid == tool)
      return;
    waitpid(wi.si_pid, NULL, 0);
  }
}

/* The supervisor's wait: returns when the tool has exited, the runner sent
 * AG__CMD_KILL or is gone, or nothing can be watched any more. Passes
 * AG__CMD_TERM on to the tool's group meanwhile. */
static void sup_watch(pid_t tool, int sfd, int life_fd, pid_t runner) {
  for (;;) {
    bool done = false;
    struct pollfd pfd[2] = {{life_fd, POLLIN, 0}, {sfd, POLLIN, 0}};
    int r = poll(pfd, life_fd >= 0 ? 2 : 1, -1);
    if (r < 0 && errno != EINTR && errno != EAGAIN)
      return; /* cannot watch any more: kill and go */
    if (life_fd >= 0 && pfd[0].revents != 0) {
      char cmd[64];
      ssize_t n = read(life_fd, cmd, sizeof(cmd));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
        return; /* the runner is gone */
      for (ssize_t i = 0; i < n; i++) {
        if (cmd[i] == AG__CMD_TERM)
          kill(-tool, SIGTERM);
        else if (cmd[i] == AG__CMD_KILL)
          done = true;
      }
    }
    if (pfd[1].revents != 0) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGHUP && getppid() != runner)
          done = true; /* parent-death signal */
      }
    }
    /* Did the tool exit? Looked at without reaping, so its group id stays
     * ours until the group is killed. */
    siginfo_t wi;
    memset(&wi, 0, sizeof(wi));
    if (waitid(P_PID, (id_t)tool, &wi, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        wi.si_pid == tool)
      done = true;
    sup_reap_orphans(tool);
    if (done)
      return;
  }
}

/*
 * The supervisor: a small process per call, forked by the runner, which
 * forks the tool and outlives it. It is the tool's child subreaper, so
 * whatever the tool leaves behind - background jobs, double forks, setsid
 * daemons - is re-parented to it and killed with the tool. It watches:
 *   - the lifeline, a socket whose other end only the runner holds:
 * AG__CMD_TERM and AG__CMD_KILL, and EOF when the runner's process dies however
 * it dies (SIGKILL included), which kills the tree;
 *   - a signalfd for SIGCHLD (the tool exited: kill what is left of its
 *     tree, reap everything, report the tool's status, exit) and SIGHUP,
 *     which is also its parent-death signal (then getppid() changed).
 * Every signal stays blocked (the runner's thread blocked them around fork),
 * so a Ctrl-C on the terminal does not reach it; the runner decides.
 */
void ag__supervisor_run(const char *const *argv, const ag_rlimits *limits,
                        char *const *envp, int cwd_fd, int stdio[3],
                        int status_fd, int life_fd, pid_t runner) {
  int sfd = sup_setup(cwd_fd, stdio, status_fd, life_fd, runner);
  pid_t tool =
      sup_start_tool(argv, limits, envp, stdio, status_fd, life_fd, sfd);
  sup_watch(tool, sfd, life_fd, runner);
  bool reaped = false;
  int status = 0;
  sup_kill_tree(tool, &reaped, &status);
  if (reaped)
    sup_write_msg(status_fd, AG__MSG_EXIT, status);
  _exit(0);
}
