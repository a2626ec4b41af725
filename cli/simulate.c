/*
 * cli/simulate.c - `agentguard simulate FILE`: runs a scenario (a scripted
 * model and scripted or real tools, docs/scenarios.md) through the guarded
 * agent loop, turn by turn, exactly as a live model would be run.
 *
 * Flow, one function a step: parse the options (parse_args); load and
 * check the whole scenario (sim_load: exit 2 on any problem, before anything
 * runs); open the events file and the timeline (sim_open_outputs); build
 * the agent from the public API (sim_make_agent: ag_agent_new over the
 * scripted provider, the scenario's registry and its approval and human
 * callbacks); run each turn with the caller's cancel token (sim_run_turns);
 * report (sim_report_check, sim_close_events). The exit code comes from the
 * last turn (docs/cli.md), or with --check from the comparison with the
 * turns' "expect".
 *
 * Events: the agent calls on_event on the turn's thread or a pool thread,
 * never two at once, so the three observers - the JSON Lines writer (one
 * compact object, a newline and a flush per event, so an interrupted run
 * still leaves complete lines), the timeline (cli/timeline.c) and the
 * --check event patterns - need no lock of their own.
 *
 * Signals: SIGINT, SIGTERM and SIGHUP cancel the caller's token
 * (ag_cancel_cancel is async-signal-safe): running tools get SIGTERM and,
 * after their grace period, SIGKILL; the turn ends "cancelled" with its
 * turn_end event written, later turns are not started, and the exit code
 * is 4. A second signal forces (ag_cancel_force): every tool process is
 * killed at once, without the grace, and the turn still ends with its
 * turn_end; it also restores the default dispositions, so a third signal
 * ends the program the usual way - and even then, as after a SIGKILL, each
 * tool's supervisor sees the program gone and kills the tool's processes
 * (docs/security.md). SIGPIPE is ignored while running so a closed events
 * pipe is a write error we report, not a silent death.
 *
 * Rejected: writing the timeline from ag_turn_outcome after each turn (the
 * story of the iterations is only in the events), and letting --check
 * compare whole event logs (timing-dependent; patterns say what matters).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cli.h"
#include "scenario.h"
#include "timeline.h"

typedef struct sim {
  FILE *events;
  const char *events_path;
  bool events_failed;
  int events_errno;
  cli_timeline *timeline;
  json_t *turn_end; /* the last turn_end event (own reference), or NULL */
  /* --check patterns of the current turn */
  const json_t *patterns;
  bool *matched;
  size_t n_patterns;
} sim;

static void usage(FILE *f) {
  fputs(
      "usage: agentguard simulate FILE [options]\n"
      "\n"
      "Runs a scenario - a scripted model and scripted or real tools - "
      "through the\n"
      "guarded agent loop. The scenario format is in docs/scenarios.md.\n"
      "\n"
      "options:\n"
      "  --preset NAME    use this preset instead of the scenario's\n"
      "  --config FILE    config keys applied on top of the scenario's\n"
      "  --events PATH    write every event as JSON Lines to PATH "
      "('-': stdout)\n"
      "  --events-detail counts|full\n"
      "                   full: model_request events carry the messages "
      "sent\n"
      "  --check          compare each turn with its \"expect\"; exit 0 "
      "when all match,\n"
      "                   1 when any does not\n"
      "  --timeline       print the timeline to stderr even when it is not "
      "a terminal\n"
      "  --quiet, -q      print no timeline and no outcome lines (errors and "
      "--check\n"
      "                   mismatches are still printed)\n"
      "  --help, -h       this help\n"
      "\n"
      "Exit codes: 0 the last turn completed; 3 stopped or escalated; 4 timed "
      "out or\n"
      "cancelled (Ctrl-C); 1 any other failure, or a --check mismatch; 2 "
      "invalid input\n"
      "(nothing ran). See docs/cli.md.\n",
      f);
}

static int usage_error(const char *fmt, const char *arg) {
  return cli_usage_error("simulate", fmt, arg);
}

/* ------------------------------------------------------------------------ */
/* Signals                                                                  */
/* ------------------------------------------------------------------------ */

static ag_cancel *volatile g_caller;
static volatile sig_atomic_t g_signals;

static void default_dispositions(void) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, NULL);
  sigaction(SIGTERM, &dfl, NULL);
  sigaction(SIGHUP, &dfl, NULL);
}

/* Only async-signal-safe calls: ag_cancel_cancel / ag_cancel_force are an
 * atomic CAS and a write(2); sigaction is on POSIX's list. */
static void on_signal(int sig) {
  (void)sig;
  ag_cancel *c = g_caller;
  g_signals = g_signals + 1;
  if (c == NULL)
    return;
  if (g_signals == 1) {
    ag_cancel_cancel(c, AG_CANCEL_USER);
  } else {
    ag_cancel_force(c);
    default_dispositions(); /* a third signal ends the program at once */
  }
}

typedef struct saved_signals {
  struct sigaction intr, term, hup, pipe;
} saved_signals;

static void install_signals(ag_cancel *caller, saved_signals *old) {
  g_caller = caller;
  g_signals = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  /* One handler at a time: a burst of signals counts in order. */
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaddset(&sa.sa_mask, SIGHUP);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, &old->intr);
  sigaction(SIGTERM, &sa, &old->term);
  sigaction(SIGHUP, &sa, &old->hup);
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &old->pipe);
}

static void restore_signals(const saved_signals *old) {
  sigaction(SIGINT, &old->intr, NULL);
  sigaction(SIGTERM, &old->term, NULL);
  sigaction(SIGHUP, &old->hup, NULL);
  sigaction(SIGPIPE, &old->pipe, NULL);
  g_caller = NULL;
}

/* ------------------------------------------------------------------------ */
/* --check event patterns                                                   */
/* ------------------------------------------------------------------------ */

/*
 * Whether `value` matches `pat`: objects match when every key of the
 * pattern matches (other keys are ignored); a string matches a string that
 * contains it, or any other value whose compact JSON contains it; the
 * "event" name must be equal; numbers compare by value; an array matches
 * when every pattern item matches some item; true/false/null are equal.
 */
static bool match(const json_t *pat, const json_t *value, bool exact_string) {
  if (value == NULL)
    return false;
  switch (json_typeof(pat)) {
  case JSON_OBJECT: {
    if (!json_is_object(value))
      return false;
    const char *key;
    json_t *p;
    json_object_foreach((json_t *)pat, key, p) {
      if (!match(p, json_object_get(value, key), strcmp(key, "event") == 0))
        return false;
    }
    return true;
  }
  case JSON_ARRAY: {
    if (!json_is_array(value))
      return false;
    for (size_t i = 0; i < json_array_size(pat); i++) {
      bool found = false;
      for (size_t j = 0; j < json_array_size(value) && !found; j++)
        found = match(json_array_get(pat, i), json_array_get(value, j), false);
      if (!found)
        return false;
    }
    return true;
  }
  case JSON_STRING: {
    const char *want = json_string_value(pat);
    if (json_is_string(value)) {
      if (exact_string)
        return strcmp(json_string_value(value), want) == 0;
      return strstr(json_string_value(value), want) != NULL;
    }
    if (exact_string)
      return false;
    char *dump = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    bool hit = dump != NULL && strstr(dump, want) != NULL;
    free(dump);
    return hit;
  }
  case JSON_INTEGER:
  case JSON_REAL:
    return json_is_number(value) &&
           json_number_value(pat) == json_number_value(value);
  default:
    return json_equal((json_t *)pat, (json_t *)value);
  }
}

/* ------------------------------------------------------------------------ */
/* Events                                                                   */
/* ------------------------------------------------------------------------ */

static void on_event(void *user, const json_t *ev) {
  sim *S = user;
  if (S->events != NULL && !S->events_failed) {
    int e = cli_write_event(S->events, ev);
    if (e != 0) {
      S->events_failed = true;
      S->events_errno = e;
    }
  }
  if (S->timeline != NULL)
    cli_timeline_event(S->timeline, ev);
  if (strcmp(json_string_value(json_object_get(ev, "event")), "turn_end") ==
      0) {
    json_decref(S->turn_end);
    S->turn_end = json_incref((json_t *)ev); /* never changed once emitted */
  }
  for (size_t i = 0; i < S->n_patterns; i++)
    if (!S->matched[i] && match(json_array_get(S->patterns, i), ev, false))
      S->matched[i] = true;
}

/* ------------------------------------------------------------------------ */
/* --check                                                                  */
/* ------------------------------------------------------------------------ */

/* Bytes of a text quoted in a --check mismatch: what the turn produced (a
 * message, a final text, an event pattern) and what "expect" asked for. */
#define SHOWN_GOT 300
#define SHOWN_WANTED 200

/* Compares one turn; prints each mismatch; returns how many there were. */
static int check_turn(const char *file, size_t turn, const cli_expect *x,
                      const ag_turn_outcome *o, const sim *S) {
  int bad = 0;
  const char *status = ag_turn_status_name(o->status);
  if (strcmp(x->status, status) != 0 ||
      (x->reason != NULL && strcmp(x->reason, o->reason) != 0)) {
    fprintf(stderr, "%s: turn %zu: expected %s%s%s, got %s (%s): ", file, turn,
            x->status, x->reason ? "/" : "", x->reason ? x->reason : "", status,
            o->reason);
    cli_put_oneline(stderr, o->message, strlen(o->message), SHOWN_GOT);
    fputc('\n', stderr);
    bad++;
  }
  if (x->final_text_contains != NULL &&
      (o->final_text == NULL ||
       strstr(o->final_text, x->final_text_contains) == NULL)) {
    fprintf(stderr, "%s: turn %zu: expected the final text to contain \"", file,
            turn);
    cli_put_oneline(stderr, x->final_text_contains,
                    strlen(x->final_text_contains), SHOWN_WANTED);
    fputs("\", got ", stderr);
    if (o->final_text == NULL) {
      fputs("none\n", stderr);
    } else {
      fputc('"', stderr);
      cli_put_oneline(stderr, o->final_text, strlen(o->final_text), SHOWN_GOT);
      fputs("\"\n", stderr);
    }
    bad++;
  }
  if (x->message_contains != NULL &&
      strstr(o->message, x->message_contains) == NULL) {
    fprintf(stderr, "%s: turn %zu: expected the message to contain \"", file,
            turn);
    cli_put_oneline(stderr, x->message_contains, strlen(x->message_contains),
                    SHOWN_WANTED);
    fputs("\", got \"", stderr);
    cli_put_oneline(stderr, o->message, strlen(o->message), SHOWN_GOT);
    fputs("\"\n", stderr);
    bad++;
  }
  if (x->iterations >= 0 && x->iterations != o->iterations) {
    fprintf(stderr, "%s: turn %zu: expected %d iterations, got %d\n", file,
            turn, x->iterations, o->iterations);
    bad++;
  }
  if (x->tool_calls >= 0 && x->tool_calls != o->tool_calls) {
    fprintf(stderr, "%s: turn %zu: expected %d tool calls, got %d\n", file,
            turn, x->tool_calls, o->tool_calls);
    bad++;
  }
  for (size_t i = 0; i < S->n_patterns; i++) {
    if (S->matched[i])
      continue;
    char *dump = json_dumps(json_array_get(S->patterns, i), JSON_COMPACT);
    fprintf(stderr, "%s: turn %zu: no event matched expect.events[%zu] ", file,
            turn, i);
    if (dump != NULL)
      cli_put_oneline(stderr, dump, strlen(dump), SHOWN_GOT);
    fputc('\n', stderr);
    free(dump);
    bad++;
  }
  return bad;
}

/* ------------------------------------------------------------------------ */
/* The command                                                              */
/* ------------------------------------------------------------------------ */

typedef struct sim_args {
  const char *file;
  const char *preset;
  const char *config;
  const char *events;
  const char *events_detail;
  bool check, quiet, timeline;
} sim_args;

/* Returns -1 when parsed, else the exit code (help or a usage error). */
static int parse_args(int argc, char **argv, sim_args *a) {
  memset(a, 0, sizeof *a);
  bool options = true;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (options && arg[0] == '-' && arg[1] != '\0') {
      if (strcmp(arg, "--") == 0) {
        options = false;
        continue;
      }
      if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
        usage(stdout);
        return AG_EXIT_OK;
      }
      if (strcmp(arg, "--check") == 0) {
        a->check = true;
        continue;
      }
      if (strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0) {
        a->quiet = true;
        continue;
      }
      if (strcmp(arg, "--timeline") == 0) {
        a->timeline = true;
        continue;
      }
      static const char *const with_value[] = {"--preset", "--config",
                                               "--events", "--events-detail"};
      const char **const slot[] = {&a->preset, &a->config, &a->events,
                                   &a->events_detail};
      char msg[128];
      int got = cli_value_option(argc, argv, &i, with_value, slot, 4, msg,
                                 sizeof msg);
      if (got < 0)
        return usage_error("%s", msg);
      if (got == 0)
        return usage_error("unknown option '%s'", arg);
      continue;
    }
    if (a->file != NULL)
      return usage_error("one scenario file only (got also '%s')", arg);
    a->file = arg;
  }
  if (a->file == NULL)
    return usage_error("%s", "a scenario FILE is required");
  if (a->events_detail != NULL && strcmp(a->events_detail, "counts") != 0 &&
      strcmp(a->events_detail, "full") != 0)
    return usage_error("--events-detail %s: expected counts or full",
                       a->events_detail);
  return -1;
}

/* stat() of a path, or of stdin / stdout for "-". */
static bool stat_of(const char *path, int std_fd, struct stat *st) {
  if (strcmp(path, "-") == 0)
    return fstat(std_fd, st) == 0 && S_ISREG(st->st_mode);
  return stat(path, st) == 0;
}

/* Refuses (exit 2, before anything is read or written) an --events file
 * that is one of the inputs, under any name: the same device and inode once
 * symbolic links are followed. An events file that does not exist yet
 * cannot be an input. Returns -1 when all is well. */
static int refuse_output_over_input(const sim_args *a) {
  struct stat out;
  if (a->events == NULL || !stat_of(a->events, STDOUT_FILENO, &out))
    return -1;
  const char *const inputs[] = {a->file, a->config};
  const char *const what[] = {"the scenario", "the --config file"};
  for (size_t i = 0; i < 2; i++) {
    struct stat in;
    if (inputs[i] == NULL || !stat_of(inputs[i], STDIN_FILENO, &in))
      continue;
    if (in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      fprintf(stderr,
              "agentguard simulate: --events %s is also an input (%s %s); "
              "writing events there would overwrite it\n",
              strcmp(a->events, "-") == 0 ? "- (stdout)" : a->events, what[i],
              inputs[i]);
      return AG_EXIT_USAGE;
    }
  }
  return -1;
}

static bool want_color(void) {
  const char *term = getenv("TERM");
  return isatty(STDERR_FILENO) && getenv("NO_COLOR") == NULL &&
         (term == NULL || strcmp(term, "dumb") != 0);
}

/* Loads and checks the scenario (exit 2 on any problem, before anything
 * runs). Returns -1 with *out set, else the exit code. */
static int sim_load(const sim_args *a, cli_scenario **out) {
  *out = NULL;
  int rc = refuse_output_over_input(a);
  if (rc >= 0)
    return rc;
  cli_scenario_opts so = {a->file, a->preset, a->config};
  cli_scenario *sc = NULL;
  rc = cli_scenario_load(&sc, &so, stderr);
  if (rc != 0)
    return rc;
  if (a->check && !cli_scenario_has_expect(sc)) {
    fprintf(stderr,
            "%s: --check: no turn has an \"expect\", so there is nothing to "
            "check\n",
            a->file);
    cli_scenario_free(sc);
    return AG_EXIT_USAGE;
  }
  *out = sc;
  return -1;
}

/* Opens the events file and the timeline (with its header). Returns -1, or
 * the exit code with whatever was opened left in S for sim_close_events. */
static int sim_open_outputs(sim *S, const sim_args *a, const cli_scenario *sc,
                            bool show_timeline) {
  if (a->events != NULL) {
    S->events_path = a->events;
    S->events = cli_open_events(a->events);
    if (S->events == NULL) {
      fprintf(stderr, "agentguard simulate: --events %s: cannot open: %s\n",
              a->events, strerror(errno));
      return AG_EXIT_USAGE;
    }
  }
  if (show_timeline) {
    S->timeline = cli_timeline_new(stderr, want_color());
    if (S->timeline == NULL) {
      fprintf(stderr, "agentguard simulate: out of memory\n");
      return AG_EXIT_FAILURE;
    }
    cli_timeline_header(S->timeline, a->file, cli_scenario_config(sc)->preset,
                        cli_scenario_description(sc));
  }
  return -1;
}

/* The caller's cancel token and the agent over the scenario's provider,
 * tools and callbacks. Returns -1, or the exit code (what was made stays in
 * *caller and *agent for the caller to free). */
static int sim_make_agent(sim *S, const sim_args *a, cli_scenario *sc,
                          ag_provider *provider, ag_cancel **caller,
                          ag_agent **agent) {
  ag_error_t err;
  if (ag_cancel_new(caller, NULL, INT64_MAX, AG_CANCEL_DEADLINE, &err) !=
      AG_OK) {
    fprintf(stderr, "agentguard simulate: %s\n", err.msg);
    return AG_EXIT_FAILURE;
  }
  ag_agent_opts ao;
  ag_agent_opts_init(&ao);
  ao.config = *cli_scenario_config(sc);
  ao.provider = provider;
  ao.tools = cli_scenario_registry(sc);
  ao.on_event = on_event;
  ao.event_user = S;
  ao.seed = 1; /* reproducible retry jitter */
  ao.events_full =
      a->events_detail != NULL && strcmp(a->events_detail, "full") == 0;
  cli_scenario_callbacks(sc, &ao);
  ag_err_t e = ag_agent_new(agent, &ao, &err);
  if (e != AG_OK) {
    fprintf(stderr, "%s: %s\n", a->file, err.msg[0] ? err.msg : ag_strerror(e));
    return e == AG_ECONFIG || e == AG_EINVAL ? AG_EXIT_USAGE : AG_EXIT_FAILURE;
  }
  return -1;
}

/* How the turns went, for the --check summary. */
typedef struct sim_tally {
  int mismatches;
  size_t checked;   /* turns compared with their "expect" */
  bool interrupted; /* a signal cancelled the run */
  bool aborted;     /* an error ended the run */
} sim_tally;

/* Arms the --check event patterns of one turn (none when not checking).
 * Returns false when out of memory. */
static bool arm_patterns(sim *S, const cli_expect *x, bool checking) {
  S->patterns = NULL;
  S->n_patterns = 0;
  free(S->matched);
  S->matched = NULL;
  if (!checking || x->events == NULL || json_array_size(x->events) == 0)
    return true;
  S->matched = calloc(json_array_size(x->events), sizeof *S->matched);
  if (S->matched == NULL)
    return false;
  S->patterns = x->events;
  S->n_patterns = json_array_size(x->events);
  return true;
}

/* Runs every turn with the caller's token, signals installed; stops after
 * an interrupted turn or an error. Returns the exit code of the last turn
 * (4 when interrupted, 1 on an error). */
static int sim_run_turns(sim *S, const sim_args *a, cli_scenario *sc,
                         ag_agent *agent, ag_cancel *caller, bool show_timeline,
                         sim_tally *t) {
  memset(t, 0, sizeof *t);
  saved_signals old;
  install_signals(caller, &old);
  size_t n = cli_scenario_turn_count(sc);
  int rc = AG_EXIT_FAILURE;
  for (size_t i = 0; i < n; i++) {
    const cli_turn *turn = cli_scenario_turn(sc, i);
    const cli_expect *x = &turn->expect;
    bool checking = a->check && x->present;
    if (!arm_patterns(S, x, checking)) {
      fprintf(stderr, "agentguard simulate: out of memory\n");
      rc = AG_EXIT_FAILURE;
      t->aborted = true;
      break;
    }
    ag_turn_outcome o;
    memset(&o, 0, sizeof o);
    json_decref(S->turn_end);
    S->turn_end = NULL;
    ag_error_t err;
    ag_err_t e = ag_agent_run_turn(agent, turn->user, caller, &o, &err);
    if (e != AG_OK) {
      fprintf(stderr, "agentguard simulate: turn %zu: %s\n", i + 1,
              err.msg[0] ? err.msg : ag_strerror(e));
      ag_turn_outcome_clear(&o);
      rc = AG_EXIT_FAILURE;
      t->aborted = true;
      break;
    }
    if (!show_timeline && !a->quiet)
      cli_outcome_line(stderr, i + 1, &o, S->turn_end);
    if (checking) {
      t->mismatches += check_turn(a->file, i + 1, x, &o, S);
      t->checked++;
    }
    rc = cli_exit_code(o.status);
    t->interrupted = ag_cancel_check(caller, ag_now_ms()) != AG_CANCEL_NONE;
    ag_turn_outcome_clear(&o);
    if (t->interrupted) {
      if (i + 1 < n)
        fprintf(stderr,
                "agentguard simulate: interrupted; %zu turn%s not run\n",
                n - i - 1, n - i - 1 == 1 ? "" : "s");
      rc = AG_EXIT_TIMEOUT;
      break;
    }
  }
  restore_signals(&old);
  free(S->matched);
  S->matched = NULL;
  return rc;
}

/* With --check, after a run that went through: the summary, and exit 0 or
 * 1 from the comparison instead of the last turn's code. */
static int sim_report_check(const sim_args *a, const sim_tally *t, int rc) {
  if (!a->check || t->interrupted || t->aborted)
    return rc;
  if (t->mismatches > 0) {
    fprintf(stderr, "%s: check failed: %d mismatch%s\n", a->file, t->mismatches,
            t->mismatches == 1 ? "" : "es");
    return AG_EXIT_FAILURE;
  }
  if (t->checked > 0) {
    if (!a->quiet)
      fprintf(stderr, "%s: check passed: %zu turn%s as expected\n", a->file,
              t->checked, t->checked == 1 ? "" : "s");
    return AG_EXIT_OK;
  }
  return rc;
}

/* Closes the events file; a write that failed on the way (or the close)
 * is reported and makes the exit code 1, unless it is a usage error. */
static int sim_close_events(sim *S, int rc) {
  if (S->events != NULL && S->events != stdout) {
    if (fclose(S->events) != 0 && !S->events_failed) {
      S->events_failed = true;
      S->events_errno = errno;
    }
  }
  if (S->events_failed) {
    fprintf(stderr, "agentguard simulate: cannot write events to %s: %s\n",
            strcmp(S->events_path, "-") == 0 ? "stdout" : S->events_path,
            strerror(S->events_errno));
    if (rc != AG_EXIT_USAGE)
      rc = AG_EXIT_FAILURE;
  }
  return rc;
}

int cli_simulate(int argc, char **argv) {
  sim_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  cli_scenario *sc = NULL;
  rc = sim_load(&a, &sc);
  if (rc >= 0)
    return rc;

  sim S;
  memset(&S, 0, sizeof S);
  bool show_timeline = a.timeline || (!a.quiet && isatty(STDERR_FILENO));
  rc = sim_open_outputs(&S, &a, sc, show_timeline);
  if (rc < 0) {
    ag_cancel *caller = NULL;
    ag_agent *agent = NULL;
    ag_provider *provider = cli_scenario_take_provider(sc);
    rc = sim_make_agent(&S, &a, sc, provider, &caller, &agent);
    if (rc < 0) {
      sim_tally t;
      rc = sim_run_turns(&S, &a, sc, agent, caller, show_timeline, &t);
      rc = sim_report_check(&a, &t, rc);
    }
    ag_agent_free(agent);
    ag_provider_free(provider);
    ag_cancel_free(caller);
  }
  cli_timeline_free(S.timeline);
  json_decref(S.turn_end);
  rc = sim_close_events(&S, rc);
  cli_scenario_free(sc);
  return rc;
}
