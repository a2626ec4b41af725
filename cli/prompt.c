/*
 * cli/prompt.c - the session's prompt (cli/prompt.h) on libedit's native
 * interface (histedit.h).
 *
 * libedit reads one character per el_gets() call in its unbuffered mode,
 * so the wait for input stays ours: ppoll(2) with the stop signals
 * unblocked inside it only, then one el_gets() for what arrived (a key
 * that sends several bytes, an arrow, is read whole by libedit). Setting
 * the unbuffered mode puts the terminal in libedit's raw mode (ISIG kept:
 * Ctrl-C still raises SIGINT), clears the line and draws the prompt;
 * clearing it gives the terminal back cooked, as the turn and the
 * approval questions read it. libedit's own signal handlers are off
 * (EL_SIGNAL 0): the program's handlers stay the only ones.
 */
#define _GNU_SOURCE
#include "prompt.h"

#include <errno.h>
#include <histedit.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cli_prompt {
  EditLine *el;
  History *hist;
  const char *text; /* the prompt shown, for prompt_text() */
};

bool cli_wait_input(int fd, const sigset_t *open_mask) {
  struct pollfd pf = {fd, POLLIN, 0};
  for (;;) {
    if (ppoll(&pf, 1, NULL, open_mask) >= 0)
      return true;
    if (errno == EINTR)
      return false;
  }
}

static char *prompt_text(EditLine *el) {
  cli_prompt *p = NULL;
  el_get(el, EL_CLIENTDATA, &p);
  return (char *)(p != NULL && p->text != NULL ? p->text : "");
}

cli_prompt *cli_prompt_new(FILE *in, FILE *out, int history_max) {
  cli_prompt *p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->el = el_init("agentguard", in, out, out);
  p->hist = history_init();
  if (p->el == NULL || p->hist == NULL) {
    cli_prompt_free(p);
    return NULL;
  }
  HistEvent ev;
  history(p->hist, &ev, H_SETSIZE, history_max);
  history(p->hist, &ev, H_SETUNIQUE, 1); /* Enter twice: kept once */
  el_set(p->el, EL_CLIENTDATA, p);
  el_set(p->el, EL_PROMPT, prompt_text);
  el_set(p->el, EL_EDITOR, "emacs");
  el_set(p->el, EL_SIGNAL, 0);
  el_set(p->el, EL_HIST, history, p->hist);
  return p;
}

cli_prompt_result cli_prompt_read(cli_prompt *p, const char *text,
                                  const sigset_t *open_mask, char *buf,
                                  size_t cap) {
  FILE *in = NULL;
  el_get(p->el, EL_GETFP, 0, &in);
  int fd = in != NULL ? fileno(in) : STDIN_FILENO;
  p->text = text;
  el_set(p->el, EL_UNBUFFERED, 1); /* raw, an empty line, the prompt */
  cli_prompt_result r = CLI_PROMPT_EOF;
  for (;;) {
    if (!cli_wait_input(fd, open_mask)) {
      r = CLI_PROMPT_SIGNAL;
      break;
    }
    int n = 0;
    const char *s = el_gets(p->el, &n);
    if (s == NULL || n <= 0)
      break; /* the input ended or failed */
    if (n == 1 && s[0] == '\004')
      break; /* Ctrl-D on an empty line: libedit returns the ^D itself */
    if (s[n - 1] != '\n' && s[n - 1] != '\r')
      continue; /* still editing */
    size_t len = (size_t)n - 1;
    if (len >= cap) {
      r = CLI_PROMPT_TOO_LONG;
      break;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    r = CLI_PROMPT_LINE;
    break;
  }
  el_set(p->el, EL_UNBUFFERED, 0); /* the terminal cooked again */
  p->text = NULL;
  if (r == CLI_PROMPT_LINE && buf[strspn(buf, " \t")] != '\0') {
    HistEvent ev;
    history(p->hist, &ev, H_ENTER, buf);
  }
  return r;
}

void cli_prompt_free(cli_prompt *p) {
  if (p == NULL)
    return;
  if (p->el != NULL)
    el_end(p->el);
  if (p->hist != NULL)
    history_end(p->hist);
  free(p);
}
