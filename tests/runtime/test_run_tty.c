/*
 * tests/runtime/test_run_tty.c - `agentguard run` on a terminal: the built
 * program as a child on a pseudo-terminal, against the fake model server
 * of fake_model.c, driven through the pty's master side.
 *
 * The child gets a session of its own with the pty as its controlling
 * terminal (setsid + TIOCSCTTY), so /dev/tty is the pty and the pty's
 * VINTR (Ctrl-C) sends SIGINT to it; its stdout and stderr are the pty,
 * its stdin the pty (an interactive session) or /dev/null (a TASK, so the
 * questions can only have come from /dev/tty). The test writes what a user
 * types to the master and reads everything the program shows with poll()
 * and generous limits (the machine is shared); it never sleeps to wait.
 *
 * Covered: an interactive session keeps the history across turns and ends
 * on Ctrl-D with exit 0; Ctrl-C cancels a slow turn, not the session, and
 * `exit` ends it; approvals asked on the terminal (no, yes, always), and
 * Ctrl-C at such a question (the turn ends, nothing runs, the session goes
 * on); an escalation answered on the terminal (continue with a hint, or
 * stop).
 * Without a pty (posix_openpt and friends fail) every test skips, saying
 * why. The child is killed after each test, whatever happened.
 */
#define _GNU_SOURCE /* posix_openpt, grantpt, ptsname_r, TIOCSCTTY */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "fake_model.h"

#define BIN AG_BINARY_DIR "/agentguard"
#define KEY "sk-run-tty-KEY-0123456789abcdef"
#define WAIT_MS 20000        /* for one expected thing on the pty */
#define SHOWN_MAX (1u << 20) /* bytes of pty output kept */

#define PROMPT "agentguard> "
#define ALLOW_Q "Allow? [y]es, [a]lways for this tool, [N]o: "
#define DECIDE_Q "The guard asks you to decide: "
#define CONTINUE_Q "Continue? [c]ontinue, [S]top: "
#define HINT_Q "A hint for the model (Enter for none): "

#define PLAIN_CONFIG "{\"provider\": {\"stream\": false}}"
#define ESCALATE_CONFIG                                                        \
  "{\"provider\": {\"stream\": false}, \"errors\": {\"on_trip\": "             \
  "\"escalate\"}}"

extern char **environ;

static char workdir[256];
static bool stopped; /* stop() ran */

/* The child on the pty and what it showed ('\r' dropped). */
static struct {
  int master; /* -1 when none */
  pid_t pid;  /* 0 when none or reaped */
  char *shown;
  size_t len;
  size_t seen; /* expect() looks from here on */
  bool eof;    /* the slave side is closed everywhere */
} T;

static void kill_child(void) {
  if (T.pid > 0) {
    kill(-T.pid, SIGKILL); /* its process group: it leads its session */
    kill(T.pid, SIGKILL);
    while (waitpid(T.pid, NULL, 0) < 0 && errno == EINTR) {
    }
    T.pid = 0;
  }
  if (T.master >= 0)
    close(T.master);
  T.master = -1;
}

static void start(void) {
  stopped = false;
  fake_start();
  snprintf(workdir, sizeof(workdir), "/tmp/ag-run-tty-XXXXXX");
  cr_assert_not_null(mkdtemp(workdir));
  T.master = -1;
  T.pid = 0;
  T.shown = malloc(SHOWN_MAX + 1);
  cr_assert_not_null(T.shown);
  T.shown[0] = '\0';
  T.len = T.seen = 0;
  T.eof = false;
}

/* Also called before a skip: Criterion runs no .fini after cr_skip_test. */
static void stop(void) {
  if (stopped)
    return;
  stopped = true;
  kill_child(); /* first: it may be waiting on the server */
  fake_stop();
  free(T.shown);
  T.shown = NULL;
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s.config.json'", workdir, workdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", workdir);
}

TestSuite(run_tty, .init = start, .fini = stop, .timeout = 240);

/* ---- the pty ------------------------------------------------------------ */

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Skips the test, saying so on stderr (`make test` lists these lines). */
static void skip_no_pty(const char *what, int e) {
  stop();
  fprintf(stderr, "skipped: %s::%s: cannot make a pseudo-terminal: %s: %s\n",
          criterion_current_test->category, criterion_current_test->name, what,
          strerror(e));
  cr_skip_test("skipped: cannot make a pseudo-terminal: %s: %s", what,
               strerror(e));
}

/* Reads what is there, waiting up to wait_ms for something: the bytes
 * read (0: none yet), or -1 at the end of the output (EIO on Linux once
 * every fd of the slave side is closed). */
static int pump(int wait_ms) {
  if (T.eof)
    return -1;
  struct pollfd p = {.fd = T.master, .events = POLLIN};
  int n = poll(&p, 1, wait_ms);
  if (n < 0 && errno == EINTR)
    return 0;
  cr_assert_geq(n, 0, "poll: %s", strerror(errno));
  if (n == 0)
    return 0;
  char chunk[4096];
  ssize_t got = read(T.master, chunk, sizeof(chunk));
  if (got < 0 && (errno == EINTR || errno == EAGAIN))
    return 0;
  if (got <= 0) {
    T.eof = true;
    return -1;
  }
  for (ssize_t i = 0; i < got; i++) {
    if (chunk[i] == '\r')
      continue;
    cr_assert_lt(T.len, SHOWN_MAX, "more than %u bytes on the pty:\n%s",
                 SHOWN_MAX, T.shown);
    T.shown[T.len++] = chunk[i];
  }
  T.shown[T.len] = '\0';
  return (int)got;
}

/* Waits until `text` appears after what earlier calls matched; fails
 * showing the pty's output when it does not within WAIT_MS. */
static void expect(const char *text) {
  int64_t until = now_ms() + WAIT_MS;
  for (;;) {
    const char *at = strstr(T.shown + T.seen, text);
    if (at != NULL) {
      T.seen = (size_t)(at - T.shown) + strlen(text);
      return;
    }
    int64_t left = until - now_ms();
    if (left <= 0 || pump((int)left) < 0)
      break;
  }
  cr_assert_fail("\"%s\" did not appear on the pty (%s); it showed:\n"
                 "----\n%s\n----",
                 text, T.eof ? "its output ended" : "waited 20 s", T.shown);
}

/* Types `s` on the terminal. */
static void type(const char *s) {
  size_t len = strlen(s), off = 0;
  while (off < len) {
    ssize_t n = write(T.master, s + off, len - off);
    if (n < 0 && errno == EINTR)
      continue;
    cr_assert_gt(n, 0, "writing to the pty: %s", strerror(errno));
    off += (size_t)n;
  }
}

/* Waits for the child to end, reading its output; returns its exit code
 * (128 + the signal when killed). Fails showing the pty on a timeout. */
static int child_exit(void) {
  int64_t until = now_ms() + WAIT_MS;
  int st;
  for (;;) {
    pid_t w = waitpid(T.pid, &st, WNOHANG);
    if (w == T.pid)
      break;
    cr_assert(w == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
    int64_t left = until - now_ms();
    if (left <= 0)
      cr_assert_fail("agentguard did not exit within 20 s; the pty showed:\n"
                     "----\n%s\n----",
                     T.shown);
    /* its output ends when it exits (poll wakes then); the cap is a tick
     * for a child whose output ended before it did */
    if (pump(left < 100 ? (int)left : 100) < 0) {
      struct pollfd none;
      poll(&none, 0, 20);
    }
  }
  T.pid = 0;
  while (pump(0) > 0) {
  }
  cr_assert(strstr(T.shown, "Sanitizer") == NULL &&
                strstr(T.shown, "runtime error:") == NULL,
            "a sanitizer report:\n%s", T.shown);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The environment: the test's own, without what would change the run,
 * with the key, no colour, and no proxy for the fake server. Caller frees
 * the array (the strings are environ's or literals). */
static char **child_env(void) {
  size_t n = 0;
  while (environ[n] != NULL)
    n++;
  char **env = calloc(n + 5, sizeof(char *));
  cr_assert_not_null(env);
  static const char *const drop[] = {"OPENAI_API_KEY=", "AGENTGUARD_",
                                     "NO_PROXY=",       "no_proxy=",
                                     "NO_COLOR=",       "TERM="};
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    bool keep = true;
    for (size_t d = 0; d < sizeof(drop) / sizeof(drop[0]); d++)
      keep = keep && strncmp(environ[i], drop[d], strlen(drop[d])) != 0;
    if (keep)
      env[k++] = environ[i];
  }
  env[k++] = "OPENAI_API_KEY=" KEY;
  env[k++] = "NO_PROXY=127.0.0.1";
  env[k++] = "NO_COLOR=1";
  env[k++] = "TERM=dumb";
  env[k] = NULL;
  return env;
}

/*
 * Starts `agentguard run` against the fake server with `config` (JSON),
 * `extra` arguments (NULL-terminated, or NULL) and TASK (NULL: an
 * interactive session), on a new pty. stdin is the pty when
 * `stdin_is_tty`, else /dev/null. Skips the test when no pty can be made.
 */
static void spawn(const char *config, const char *const *extra,
                  const char *task, bool stdin_is_tty) {
  char url[64], cfg[320];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", F.port);
  snprintf(cfg, sizeof(cfg), "%s.config.json", workdir);
  FILE *f = fopen(cfg, "w");
  cr_assert_not_null(f);
  fputs(config, f);
  cr_assert_eq(fclose(f), 0);
  const char *argv[32];
  size_t n = 0;
  argv[n++] = BIN;
  argv[n++] = "run";
  argv[n++] = "--model";
  argv[n++] = "fake-model";
  argv[n++] = "--base-url";
  argv[n++] = url;
  argv[n++] = "--workdir";
  argv[n++] = workdir;
  argv[n++] = "--config";
  argv[n++] = cfg;
  for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 28; i++)
    argv[n++] = extra[i];
  if (task != NULL)
    argv[n++] = task;
  argv[n] = NULL;

  T.master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (T.master < 0)
    skip_no_pty("posix_openpt", errno);
  if (grantpt(T.master) != 0)
    skip_no_pty("grantpt", errno);
  if (unlockpt(T.master) != 0)
    skip_no_pty("unlockpt", errno);
  char name[128];
  int e = ptsname_r(T.master, name, sizeof(name));
  if (e != 0)
    skip_no_pty("ptsname_r", e);
  int slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0)
    skip_no_pty(name, errno);
  /* a terminal as a user's: lines, echo, Ctrl-C and Ctrl-D */
  struct termios tio;
  cr_assert_eq(tcgetattr(slave, &tio), 0, "tcgetattr: %s", strerror(errno));
  tio.c_lflag |= ICANON | ISIG | ECHO;
  tio.c_iflag |= ICRNL;
  tio.c_cc[VINTR] = 0x03;
  tio.c_cc[VEOF] = 0x04;
  cr_assert_eq(tcsetattr(slave, TCSANOW, &tio), 0, "tcsetattr: %s",
               strerror(errno));
  struct winsize ws = {.ws_row = 24, .ws_col = 120};
  ioctl(slave, TIOCSWINSZ, &ws);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  cr_assert_geq(devnull, 0);
  char **env = child_env();

  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    /* only async-signal-safe calls: the test has the server's threads */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    static const int sigs[] = {SIGINT,  SIGQUIT, SIGTERM, SIGHUP,
                               SIGPIPE, SIGCHLD, SIGTTIN, SIGTTOU};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
      sigaction(sigs[i], &dfl, NULL);
    if (setsid() < 0 || ioctl(slave, TIOCSCTTY, 0) != 0)
      _exit(125);
    if (dup2(stdin_is_tty ? slave : devnull, 0) < 0 || dup2(slave, 1) < 0 ||
        dup2(slave, 2) < 0)
      _exit(125);
    execve(BIN, (char *const *)argv, env);
    _exit(127);
  }
  T.pid = pid;
  free(env);
  close(devnull);
  close(slave); /* the child's alone now: EIO on the master when it ends */
}

static bool file_exists(const char *name) {
  char path[400];
  snprintf(path, sizeof(path), "%s/%s", workdir, name);
  return access(path, F_OK) == 0;
}

/* ---- the tests ---------------------------------------------------------- */

Test(run_tty, a_session_keeps_the_history_and_ends_on_ctrl_d) {
  F.replies[0] = TEXT_REPLY("First answer BRAVO.");
  F.replies[1] = TEXT_REPLY("Second answer DELTA.");
  F.n_replies = 2;
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect("a session with fake-model (openai, http://127.0.0.1:");
  expect("Ctrl-D or \"exit\" ends the session.");
  expect(PROMPT);
  type("Remember the word ALPHA\r");
  expect("First answer BRAVO.");
  expect(PROMPT);
  type("Which word was it? CHARLIE\r");
  expect("Second answer DELTA.");
  expect(PROMPT);
  type("\x04"); /* Ctrl-D on an empty line */
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert_eq(F.n_requests, 2, "%d requests", F.n_requests);
  /* the second request carries the first turn: its task and its answer,
   * in order, before the new task */
  char *second = fake_body(1);
  cr_assert_not_null(second);
  const char *task1 = strstr(second, "Remember the word ALPHA");
  const char *answer1 = strstr(second, "First answer BRAVO.");
  const char *task2 = strstr(second, "Which word was it? CHARLIE");
  cr_assert(task1 != NULL && answer1 != NULL && task2 != NULL &&
                task1 < answer1 && answer1 < task2,
            "the second request lost the first turn:\n%s", second);
  free(second);
}

/* The prompt edits lines (libedit, emacs keys) and keeps the session's
 * tasks: Up brings the last one back, Ctrl-A goes to the line's start,
 * Backspace erases; what is sent is the edited line. */
Test(run_tty, the_prompt_edits_lines_and_recalls_earlier_ones) {
  F.replies[0] = TEXT_REPLY("Answer INDIA.");
  F.replies[1] = TEXT_REPLY("Answer JULIETT.");
  F.n_replies = 2;
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect(PROMPT);
  type("Count the filesX\x7f\r"); /* Backspace erases the X */
  expect("Answer INDIA.");
  expect(PROMPT);
  type("\033[A"); /* Up: the last task again */
  type("\x01"
       "Again: \r"); /* Ctrl-A, then text at the line's start */
  expect("Answer JULIETT.");
  expect(PROMPT);
  type("exit\r");
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert_eq(F.n_requests, 2, "%d requests", F.n_requests);
  char *first = fake_body(0), *second = fake_body(1);
  cr_assert(first != NULL && second != NULL);
  cr_assert(strstr(first, "\"Count the files\"") != NULL, "%s", first);
  cr_assert(strstr(second, "\"Again: Count the files\"") != NULL,
            "%s\nthe pty showed:\n%s", second, T.shown);
  free(first);
  free(second);
}

/* A Ctrl-C that comes while the session is not yet in its ppoll must
 * stay pending for the thread that waits there: every other thread of the
 * program blocks SIGINT (the "waiting for the model" ticker once took it,
 * and the session then waited for ever). Read from /proc: each thread's
 * blocked set, at the prompt. */
Test(run_tty, only_the_waiting_thread_takes_ctrl_c) {
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect(PROMPT);
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)T.pid);
  DIR *d = opendir(dir);
  if (d == NULL)
    cr_skip_test("no %s: %s", dir, strerror(errno));
  int others = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == T.pid)
      continue; /* the main thread: it waits in ppoll, SIGINT open */
    char path[400], line[256];
    snprintf(path, sizeof path, "%s/%s/status", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue; /* it ended meanwhile */
    unsigned long long blk = 0;
    bool seen = false;
    while (fgets(line, sizeof line, f) != NULL)
      if (sscanf(line, "SigBlk: %llx", &blk) == 1)
        seen = true;
    fclose(f);
    cr_assert(seen, "no SigBlk in %s", path);
    cr_expect(blk & (1ull << (SIGINT - 1)),
              "thread %s takes SIGINT (SigBlk %llx)", e->d_name, blk);
    others++;
  }
  closedir(d);
  cr_expect_gt(others, 0, "the ticker thread was not found");
  type("exit\r");
  cr_expect_eq(child_exit(), 0);
}

Test(run_tty, ctrl_c_cancels_the_turn_not_the_session) {
  F.replies[0] = TEXT_REPLY("Too late ECHO.");
  F.delay_ms[0] = 200000; /* until the test ends: only Ctrl-C ends the turn */
  F.replies[1] = TEXT_REPLY("Quick answer FOXTROT.");
  F.n_replies = 2;
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect(PROMPT);
  type("A slow task\r");
  /* the request is at the server: the turn is running */
  cr_assert_eq(fake_wait_requests(1, WAIT_MS), 1,
               "the first request never came; the pty showed:\n%s", T.shown);
  type("\x03"); /* Ctrl-C: the pty sends SIGINT to the session */
  expect("The turn was cancelled");
  expect(PROMPT);
  type("A quick task\r");
  expect("Quick answer FOXTROT.");
  expect(PROMPT);
  type("exit\r");
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert(strstr(T.shown, "Too late ECHO.") == NULL, "%s", T.shown);
  cr_assert_eq(F.n_requests, 2, "%d requests", F.n_requests);
  char *second = fake_body(1);
  cr_assert_not_null(second);
  cr_assert(strstr(second, "A quick task") != NULL, "%s", second);
  free(second);
}

/* Ctrl-C at the prompt drops the line typed so far and asks again, as a
 * shell does (it used to end the session: SIGINT had its default action
 * outside a turn). The answer is shown once, though the provider does not
 * stream. */
Test(run_tty, ctrl_c_at_the_prompt_asks_again) {
  F.replies[0] = TEXT_REPLY("Answer HOTEL.");
  F.n_replies = 1;
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect(PROMPT);
  type("half a ta");
  type("\x03");
  expect(PROMPT);
  type("A whole task\r");
  expect("Answer HOTEL.");
  expect(PROMPT);
  type("exit\r");
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert_eq(F.n_requests, 1, "%d requests", F.n_requests);
  char *first = fake_body(0);
  cr_assert_not_null(first);
  cr_assert(strstr(first, "half a ta") == NULL, "%s", first);
  cr_assert(strstr(first, "A whole task") != NULL, "%s", first);
  free(first);
  /* stdout's lines (the timeline on stderr quotes the text) */
  int shown = 0;
  for (const char *at = T.shown; (at = strstr(at, "Answer HOTEL.")) != NULL;
       at++)
    shown += at == T.shown || at[-1] != '"';
  cr_assert_eq(shown, 1, "the answer was shown %d times:\n%s", shown, T.shown);
}

Test(run_tty, approvals_are_asked_on_the_terminal) {
  F.replies[0] = CALL_REPLY(
      "run_command", "\"{\\\"command\\\":\\\"touch denied.txt; echo d\\\"}\"");
  F.replies[1] =
      CALL_REPLY("run_command",
                 "\"{\\\"command\\\":\\\"touch approved.txt; echo ap\\\"}\"");
  F.replies[2] =
      CALL_REPLY("run_command",
                 "\"{\\\"command\\\":\\\"touch always1.txt; echo a1\\\"}\"");
  F.replies[3] =
      CALL_REPLY("run_command",
                 "\"{\\\"command\\\":\\\"touch always2.txt; echo a2\\\"}\"");
  F.replies[4] = TEXT_REPLY("All done GOLF.");
  F.n_replies = 5;
  const char *const extra[] = {"--allow-commands", NULL};
  /* stdin is /dev/null: the questions can only be asked on /dev/tty */
  spawn(PLAIN_CONFIG, extra, "Touch some files", false);
  expect("run_command wants to run: ");
  expect("touch denied.txt");
  expect(ALLOW_Q);
  type("n\r");
  expect("run_command wants to run: ");
  expect("touch approved.txt");
  expect(ALLOW_Q);
  type("y\r");
  expect("run_command wants to run: ");
  expect("touch always1.txt");
  expect(ALLOW_Q);
  type("a\r"); /* always, for this tool: the next call is not asked about */
  size_t after_always = T.seen;
  expect("All done GOLF.");
  int status = child_exit();
  cr_assert(strstr(T.shown + after_always, "Allow?") == NULL &&
                strstr(T.shown + after_always, "wants to run") == NULL,
            "asked again after \"always\":\n%s", T.shown);
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert(!file_exists("denied.txt"), "the denied command ran:\n%s", T.shown);
  cr_assert(file_exists("approved.txt"), "the approved command did not run");
  cr_assert(file_exists("always1.txt") && file_exists("always2.txt"),
            "a command approved for the session did not run:\n%s", T.shown);
  char *second = fake_body(1);
  cr_assert_not_null(second);
  cr_assert(strstr(second, "the user said no") != NULL,
            "the model was not told of the denial:\n%s", second);
  free(second);
}

Test(run_tty, ctrl_c_at_a_question_cancels_the_turn) {
  F.replies[0] = CALL_REPLY(
      "run_command", "\"{\\\"command\\\":\\\"touch never.txt; echo n\\\"}\"");
  F.replies[1] = CALL_REPLY(
      "run_command", "\"{\\\"command\\\":\\\"touch later.txt; echo l\\\"}\"");
  F.replies[2] = TEXT_REPLY("Touched HOTEL.");
  F.n_replies = 3;
  const char *const extra[] = {"--allow-commands", NULL};
  spawn(PLAIN_CONFIG, extra, NULL, true);
  expect(PROMPT);
  type("Touch a file\r");
  expect("touch never.txt");
  expect(ALLOW_Q);
  type("\x03"); /* Ctrl-C at the question: no answer, and the turn ends */
  expect("The turn was cancelled");
  expect(PROMPT);
  /* the terminal still answers questions after the interrupted one */
  type("Touch another\r");
  expect("touch later.txt");
  expect(ALLOW_Q);
  type("y\r");
  expect("Touched HOTEL.");
  expect(PROMPT);
  type("\x04");
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert(!file_exists("never.txt"), "ran without an answer:\n%s", T.shown);
  cr_assert(file_exists("later.txt"), "the approved command did not run:\n%s",
            T.shown);
}

Test(run_tty, an_escalation_continues_with_a_hint) {
  F.replies[0] = CALL_REPLY("list_dir", "\"{\\\"path\\\":\\\".\\\"}\"");
  F.n_replies = 1; /* the same call forever, until the hint arrives */
  F.if_body_has = "HINT-KILO";
  F.then_reply = TEXT_REPLY("Stopping as told.");
  spawn(ESCALATE_CONFIG, NULL, "List the files", false);
  expect(DECIDE_Q);
  expect("Repeated calls to list_dir");
  expect(CONTINUE_Q);
  type("c\r");
  expect(HINT_Q);
  type("HINT-KILO: stop listing\r");
  expect("Stopping as told.");
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
  int n = F.n_requests;
  cr_assert_geq(n, 2, "%d requests", n);
  char *last = fake_body(n - 1), *before = fake_body(n - 2);
  cr_assert(last != NULL && before != NULL);
  cr_assert(strstr(last, "HINT-KILO: stop listing") != NULL,
            "the hint did not reach the model:\n%s", last);
  cr_assert(strstr(before, "HINT-KILO") == NULL, "%s", before);
  free(last);
  free(before);
}

Test(run_tty, an_escalation_stopped_on_the_terminal) {
  F.replies[0] = CALL_REPLY("list_dir", "\"{\\\"path\\\":\\\".\\\"}\"");
  F.n_replies = 1;
  spawn(ESCALATE_CONFIG, NULL, "List the files", false);
  expect(DECIDE_Q);
  expect(CONTINUE_Q);
  int asked_at = fake_wait_requests(1, 0);
  type("\r"); /* Enter: the default, stop */
  expect("escalated · ");
  int status = child_exit();
  cr_assert_eq(status, 3, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert(strstr(T.shown, HINT_Q) == NULL, "%s", T.shown);
  cr_assert_eq(F.n_requests, asked_at, "the model was asked again");
}

Test(run_tty, exit_after_a_stopped_turn_ends_the_session_with_0) {
  F.replies[0] =
      CALL_REPLY("list_dir", "\"{\\\"path\\\":\\\".\\\"}\""); /* forever */
  F.n_replies = 1;
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect(PROMPT);
  type("List the files\r");
  expect("stopped");
  expect(PROMPT);
  type("exit\r");
  int status = child_exit();
  cr_assert_eq(status, 0,
               "exit %d: the session ended as asked; the pty "
               "showed:\n%s",
               status, T.shown);
}

/* A slow model: "waiting for the model (N s)" counts on the terminal, and
 * its line is erased (ESC [ K) before the answer is written. */
Test(run_tty, a_slow_model_shows_the_wait_and_erases_it) {
  F.replies[0] = TEXT_REPLY("Slow answer GOLF.");
  F.delay_ms[0] = 2600;
  F.n_replies = 1;
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect(PROMPT);
  type("Take your time\r");
  expect("waiting for the model (1 s, Ctrl-C cancels)");
  expect("waiting for the model (2 s, Ctrl-C cancels)");
  expect("\033[K");
  const char *erased = T.shown + T.seen;
  expect("Slow answer GOLF.");
  cr_assert(strstr(erased, "waiting for the model") == NULL ||
                strstr(erased, "waiting for the model") >
                    strstr(erased, "Slow answer GOLF."),
            "the wait was shown again after it was erased:\n%s", T.shown);
  expect(PROMPT);
  type("exit\r");
  int status = child_exit();
  cr_assert_eq(status, 0, "exit %d; the pty showed:\n%s", status, T.shown);
}

/* The server is checked when a session starts: down, it says so at once
 * and the session does not begin. */
Test(run_tty, a_session_says_at_once_that_the_server_is_down) {
  fake_stop(); /* nothing listens on F.port any more */
  spawn(PLAIN_CONFIG, NULL, NULL, true);
  expect("agentguard run: could not reach 127.0.0.1");
  expect("Is the server running?");
  int status = child_exit();
  cr_assert_eq(status, 1, "exit %d; the pty showed:\n%s", status, T.shown);
  cr_assert(strstr(T.shown, PROMPT) == NULL, "a prompt was shown:\n%s",
            T.shown);
}
