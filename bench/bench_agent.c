/*
 * bench/bench_agent.c - the agent loop's own overhead per iteration: what
 * ag_agent_run_turn costs around the model and the tools when both answer
 * at once.
 *
 * The session. A provider of this file (an ag_provider_vtable) answers every
 * request instantly: one tool call to `read_file` with arguments that change
 * on every request ({"path":"f<n>"}, so no detector ever trips), and a final
 * text answer once the turn has made its budget of requests. `read_file` is
 * a native tool that writes a fixed 30-byte result. The provider allocates
 * nothing beyond ag_reply_add_call (and the final answer's text, once per
 * turn); the tool nothing at all. So everything measured is the loop: the
 * guard, the scheduler and retry executor (a batch of one runs on the
 * caller's thread), schema validation, the history, the events, the turn
 * start and end (turn token, tools array, history cap).
 *
 * Config: the default preset with loop.max_iterations and
 * loop.max_turn_duration set to 0 (no iteration cap, no deadline); loop
 * detection, error tracking and retries stay as the preset has them. One
 * iteration = one model request (docs/agent.md): a turn of N iterations is
 * N - 1 requests answered with a tool call, each run, and the final answer.
 *
 * What it measures:
 *   1. us per iteration over a session of 100,000 iterations in 1,000 turns
 *      of 100 (max_history_bytes 256 KiB, so the history cap works as in a
 *      long real session), and over one turn of 100,000 iterations (whose
 *      history is never dropped: the cap keeps the current turn whole). The
 *      single turn is also timed in ten stretches of 10,000 requests (the
 *      provider takes the timestamps): a per-iteration cost that grew with
 *      the history would show there, and the stretches leave out the turn's
 *      end. Agent creation and freeing are not timed.
 *   2. memory: heap in use (mallinfo2() uordblks + hblkhd, since just
 *      before the registry and the agent were made), process RSS
 *      (/proc/self/statm) and the stored history (compact JSON bytes and
 *      messages) after ag_agent_new and after 1,000, 10,000 and 100,000
 *      iterations of the multi-turn session; the same at the end of the
 *      single turn; peak RSS (getrusage ru_maxrss) after the multi-turn
 *      session and at the end.
 *   3. events: the multi-turn session again with on_event set to a callback
 *      that does nothing (the cost of building the events) and to one that
 *      serializes each with json_dumps (about what `--events` costs, minus
 *      the write).
 *   4. a turn's own cost by the size of the stored history: with the
 *      default max_history_bytes (8 MiB), one turn of 0, 1,000, 4,000 or
 *      30,000 iterations fills the history, then 21 turns of one iteration
 *      (a request answered with the final text) are timed one by one. The
 *      end of every turn serializes the whole history to check it against
 *      the cap, so this cost grows with the history; it is what makes the
 *      multi-turn figure larger than the single turn's stretches.
 *
 * Method: one untimed memory run first (so its RSS is not inflated by the
 * single turn's history), then rounds; each round runs every variant once,
 * back to back, so noise from other processes hits them alike, on a fresh
 * agent each. The figure is the median over rounds.
 *
 * Output: a readable report and machine-readable lines
 *   <metric> [key=value ...] value=<number>
 * Never fails on speed; exits 1 when something is broken (a turn that does
 * not end completed with the expected iterations and tool calls, a history
 * of the wrong length).
 *
 * Options: --iterations N (100000), --per-turn N (100), --rounds N (3),
 * --history-cap BYTES (256 KiB, the multi-turn sessions' cap), --only
 * multi_turn|single_turn|events_noop|events_json (that variant alone, no
 * memory run nor turn costs: for profiling), --quick or AG_BENCH_QUICK=1
 * (10,000 iterations, 1 round, 5 turns per turn cost).
 */
#include <malloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "agentguard.h"

#define HISTORY_CAP ((size_t)256 << 10)
#define SEGMENTS 10
#define MAX_ROUNDS 101
#define MAX_POINTS 8

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_agent: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Bytes malloc has handed out: from the arenas and, for large blocks
 * (the guard's 1 MiB scratch), mmapped. */
static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == NULL)
    return -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2)
    resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static long peak_rss_kib(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
}

/* The history's size as compact JSON: what the history cap compares. */
static size_t history_bytes(const ag_agent *a) {
  size_t n = 0;
  ag_agent_history_json(a, &n);
  return n;
}

/* The number of messages in the history (parses it: not timed). */
static size_t history_messages(const ag_agent *a) {
  json_t *h = ag_agent_history(a);
  if (h == NULL)
    die("the history does not parse");
  size_t n = json_array_size(h);
  json_decref(h);
  return n;
}

/* ------------------------------------------------------------------------ */
/* The instant model and the instant tool                                   */
/* ------------------------------------------------------------------------ */

static const char final_answer[] = "All files read.";
static const char tool_result[] = "file contents: 42 lines, 1 KiB";

typedef struct instant_model {
  long per_turn;      /* requests per turn, the final answer included */
  uint64_t requests;  /* requests answered in the session */
  uint64_t seg_every; /* a timestamp every seg_every requests (0: none) */
  uint64_t start;     /* now_ns() before the first turn */
  uint64_t marks[SEGMENTS + 1];
  int n_marks;
} instant_model;

static ag_err_t instant_complete(void *self, const ag_request *req,
                                 ag_cancel *cancel, ag_delta_fn on_delta,
                                 void *delta_user, ag_reply *out,
                                 ag_provider_error *perr) {
  instant_model *m = self;
  (void)cancel;
  (void)on_delta;
  (void)delta_user;
  (void)perr;
  m->requests++;
  if (m->seg_every > 0 && m->requests % m->seg_every == 0 &&
      m->n_marks <= SEGMENTS)
    m->marks[m->n_marks++] = now_ns();
  if (req->iteration >= m->per_turn) {
    /* the reply owns its text: one allocation per turn */
    out->text = malloc(sizeof(final_answer));
    if (out->text == NULL)
      return AG_ENOMEM;
    memcpy(out->text, final_answer, sizeof(final_answer));
    return AG_OK;
  }
  char id[32], args[48];
  snprintf(id, sizeof(id), "call_%llu", (unsigned long long)m->requests);
  int n = snprintf(args, sizeof(args), "{\"path\":\"f%llu\"}",
                   (unsigned long long)m->requests);
  return ag_reply_add_call(out, id, "read_file", args, (size_t)n);
}

static const ag_provider_vtable instant_vtable = {
    sizeof(ag_provider_vtable), "instant", instant_complete, NULL,
    /* it reads no messages: spared the tree (providers.h) */
    AG_PROVIDER_MESSAGES_TEXT};

static ag_tool_status read_file_tool(void *user, const json_t *args,
                                     ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  ag_output_write(out, tool_result, sizeof(tool_result) - 1);
  return AG_TOOL_OK;
}

/* ------------------------------------------------------------------------ */
/* Event sinks                                                              */
/* ------------------------------------------------------------------------ */

typedef enum { EV_NONE = 0, EV_NOOP, EV_JSON } ev_mode;

typedef struct ev_sink {
  uint64_t events;
  uint64_t bytes; /* of the serialized events (EV_JSON) */
  bool failed;
} ev_sink;

static void ev_noop(void *user, const json_t *event) {
  ev_sink *s = user;
  (void)event;
  s->events++;
}

static void ev_json(void *user, const json_t *event) {
  ev_sink *s = user;
  char *text = json_dumps(event, JSON_COMPACT);
  s->events++;
  if (text == NULL) {
    s->failed = true;
    return;
  }
  s->bytes += strlen(text) + 1; /* and the newline of a JSON Lines file */
  free(text);
}

/* ------------------------------------------------------------------------ */
/* A session                                                                */
/* ------------------------------------------------------------------------ */

/* The objects of one session: the tool, the model, the agent. */
typedef struct rig {
  ag_registry *reg;
  instant_model *m;
  ag_provider *prov;
  ag_agent *a;
  ev_sink sink;
  long turn;
} rig;

/* history_cap 0: the default of ag_agent_opts_init (8 MiB). */
static void rig_new(rig *r, size_t history_cap, ev_mode events) {
  ag_error_t err;
  memset(r, 0, sizeof(*r));
  if (ag_registry_new(&r->reg, &err) != AG_OK)
    die("ag_registry_new: %s", err.msg);
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "read_file";
  d.description = "Reads a file";
  d.parameters = "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":"
                 "\"string\"}},\"required\":[\"path\"],"
                 "\"additionalProperties\":false}";
  d.fn = read_file_tool;
  if (ag_registry_add(r->reg, &d, &err) != AG_OK)
    die("ag_registry_add: %s", err.msg);

  r->m = calloc(1, sizeof(*r->m));
  if (r->m == NULL)
    die("out of memory");
  /* destroy is NULL: the model stays ours, freed in rig_free */
  if (ag_provider_new(&r->prov, &instant_vtable, r->m, &err) != AG_OK)
    die("ag_provider_new: %s", err.msg);

  ag_agent_opts o;
  ag_agent_opts_init(&o);
  o.config.loop.max_iterations = 0;
  o.config.loop.max_turn_duration_ms = 0;
  o.provider = r->prov;
  o.tools = r->reg;
  o.system_prompt = "You are a careful assistant. Read the files you are "
                    "asked to read, then answer.";
  if (history_cap > 0)
    o.max_history_bytes = history_cap;
  o.seed = 1;
  if (events != EV_NONE) {
    o.on_event = events == EV_JSON ? ev_json : ev_noop;
    o.event_user = &r->sink;
  }
  if (ag_agent_new(&r->a, &o, &err) != AG_OK)
    die("ag_agent_new: %s", err.msg);
}

static void rig_free(rig *r) {
  ag_agent_free(r->a);
  ag_provider_free(r->prov);
  ag_registry_free(r->reg);
  free(r->m);
  memset(r, 0, sizeof(*r));
}

static const char *outcome_text(const ag_turn_outcome *o) {
  return o->message[0] != '\0' ? o->message : "(no message)";
}

/* Runs the next turn, of `iterations` iterations (iterations - 1 tool
 * calls and the final answer); exits when it does not go exactly so. */
static void rig_turn(rig *r, long iterations) {
  char msg[64];
  ag_error_t err;
  ag_turn_outcome out;
  long t = ++r->turn;
  r->m->per_turn = iterations;
  snprintf(msg, sizeof(msg), "Task %ld: read the next files.", t);
  ag_err_t rc = ag_agent_run_turn(r->a, msg, NULL, &out, &err);
  if (rc != AG_OK)
    die("turn %ld: ag_agent_run_turn returned %s: %s", t, ag_err_name(rc),
        err.msg);
  if (out.status != AG_TURN_COMPLETED ||
      strcmp(out.reason, "final_answer") != 0)
    die("turn %ld ended %s / %s after %d iterations instead of completing: "
        "%s",
        t, ag_turn_status_name(out.status), out.reason, out.iterations,
        outcome_text(&out));
  if (out.iterations != iterations || out.tool_calls != iterations - 1)
    die("turn %ld: %d iterations and %d tool calls, expected %ld and %ld", t,
        out.iterations, out.tool_calls, iterations, iterations - 1);
  if (out.final_text == NULL || strcmp(out.final_text, final_answer) != 0)
    die("turn %ld: final text %s, expected \"%s\"", t,
        out.final_text != NULL ? out.final_text : "NULL", final_answer);
  ag_turn_outcome_clear(&out);
  if (r->sink.failed)
    die("turn %ld: an event could not be serialized", t);
}

/* Memory after `iterations` iterations of a session. */
typedef struct mem_point {
  long iterations;
  size_t heap; /* bytes since just before the session's objects were made */
  long rss_kib;
  size_t history_bytes;
  size_t history_messages;
} mem_point;

static void mem_at(mem_point *p, long iterations, size_t base,
                   const ag_agent *a) {
  p->iterations = iterations;
  p->heap = heap_in_use() - base;
  p->rss_kib = rss_kib();
  p->history_bytes = history_bytes(a);
  p->history_messages = history_messages(a);
}

typedef struct session {
  /* in */
  long iterations;
  long per_turn;
  size_t history_cap; /* opts.max_history_bytes */
  ev_mode events;
  const long *checkpoints; /* ascending iteration counts, or NULL */
  int n_checkpoints;
  bool segments; /* time the session in SEGMENTS segments */
  /* out */
  double us_per_iteration;
  double seg_us[SEGMENTS]; /* us per iteration of each segment */
  uint64_t events_seen, event_bytes;
  mem_point points[MAX_POINTS]; /* after ag_agent_new, then checkpoints */
  int n_points;
  mem_point end; /* at the end of the session, before freeing */
} session;

/* A session of s->iterations iterations in turns of s->per_turn; the time
 * of the turns only (not agent creation, not the memory checkpoints). */
static void run_session(session *s) {
  size_t base = heap_in_use();
  rig r;
  rig_new(&r, s->history_cap, s->events);
  instant_model *m = r.m;
  m->seg_every = s->segments ? (uint64_t)(s->iterations / SEGMENTS) : 0;

  s->n_points = 0;
  if (s->checkpoints != NULL)
    mem_at(&s->points[s->n_points++], 0, base, r.a);

  long turns = s->iterations / s->per_turn, done = 0;
  int next_cp = 0;
  uint64_t timed = 0, t0 = now_ns();
  m->start = t0;
  for (long t = 1; t <= turns; t++) {
    rig_turn(&r, s->per_turn);
    done += s->per_turn;
    if (next_cp < s->n_checkpoints && done >= s->checkpoints[next_cp]) {
      timed += now_ns() - t0;
      while (next_cp < s->n_checkpoints && done >= s->checkpoints[next_cp])
        next_cp++;
      if (s->n_points < MAX_POINTS)
        mem_at(&s->points[s->n_points++], done, base, r.a);
      t0 = now_ns();
    }
  }
  timed += now_ns() - t0;
  s->us_per_iteration = (double)timed / 1e3 / (double)done;
  if ((long)m->requests != done)
    die("the model answered %llu requests for %ld iterations",
        (unsigned long long)m->requests, done);

  /* The history is the system prompt and whole turns of 2 * per_turn
   * messages (the user's, per_turn assistant messages, per_turn - 1 tool
   * messages): at least the last turn, never a broken one. A turn larger
   * than the cap (the single turn) loses its oldest iterations whole, an
   * assistant message with its tool message (docs/agent.md "History
   * cap"), so it keeps an even count. */
  size_t msgs = history_messages(r.a);
  size_t per = 2 * (size_t)s->per_turn;
  bool whole = turns > 1 ? msgs >= 1 + per && (msgs - 1) % per == 0
                         : msgs >= 3 && msgs <= 1 + per && (msgs - 1) % 2 == 0;
  if (!whole)
    die("the history holds %zu messages: not a system prompt and whole "
        "turns of %zu (iterations dropped whole in a single turn)",
        msgs, per);
  mem_at(&s->end, done, base, r.a);

  memset(s->seg_us, 0, sizeof(s->seg_us));
  if (s->segments && m->n_marks >= SEGMENTS) {
    for (int k = 0; k < SEGMENTS; k++) {
      uint64_t from = k == 0 ? m->start : m->marks[k - 1];
      s->seg_us[k] = (double)(m->marks[k] - from) / 1e3 / (double)m->seg_every;
    }
  }
  s->events_seen = r.sink.events;
  s->event_bytes = r.sink.bytes;
  rig_free(&r);
}

/*
 * The cost of a turn as a function of the stored history: with the default
 * max_history_bytes (8 MiB), one turn of `build` iterations fills the
 * history, then `n` turns of one iteration (one request, the final answer)
 * are timed one by one. Returns their median in us; *hist_bytes is the
 * history's size before them.
 */
static double turn_cost(long build, int n, size_t *hist_bytes) {
  rig r;
  rig_new(&r, 0, EV_NONE);
  if (build > 0)
    rig_turn(&r, build);
  *hist_bytes = history_bytes(r.a);
  double v[MAX_ROUNDS];
  if (n > MAX_ROUNDS)
    n = MAX_ROUNDS;
  for (int i = 0; i < n; i++) {
    uint64_t t0 = now_ns();
    rig_turn(&r, 1);
    v[i] = (double)(now_ns() - t0) / 1e3;
  }
  /* nothing was dropped: the history only grew */
  if (build > 0 &&
      history_messages(r.a) != 1 + 2 * (size_t)build + 2 * (size_t)n)
    die("turn cost: the history was capped; build a smaller one");
  rig_free(&r);
  return median(v, n);
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct variant {
  const char *name;  /* for --only */
  const char *key;   /* machine-readable: session=... events=... */
  const char *label; /* for people */
  bool single;       /* one turn of every iteration */
  ev_mode events;
  bool ran;
  double us[MAX_ROUNDS];
  double seg[SEGMENTS][MAX_ROUNDS];
  session last;
} variant;

static long parse_long(const char *opt, const char *v, long min) {
  char *end;
  long n = strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n < min)
    die("%s: expected a whole number >= %ld, got \"%s\"", opt, min, v);
  return n;
}

static void print_mem_row(const char *label, const mem_point *p) {
  printf("  %-30s %13zu %10ld %12zu %9zu\n", label, p->heap, p->rss_kib,
         p->history_bytes, p->history_messages);
}

static void print_mem_lines(const char *session_key, const mem_point *p) {
  printf("agent_heap_bytes session=%s iterations=%ld value=%zu\n", session_key,
         p->iterations, p->heap);
  printf("agent_rss_kib session=%s iterations=%ld value=%ld\n", session_key,
         p->iterations, p->rss_kib);
  printf("agent_history_bytes session=%s iterations=%ld value=%zu\n",
         session_key, p->iterations, p->history_bytes);
}

int main(int argc, char **argv) {
  long iterations = 100000, per_turn = 100, rounds = 3;
  size_t history_cap = HISTORY_CAP;
  const char *only = NULL; /* one variant, no memory run (for profiling) */
  const char *q = getenv("AG_BENCH_QUICK");
  bool quick = q != NULL && strcmp(q, "1") == 0;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--quick") == 0)
      quick = true;
  if (quick) {
    iterations = 10000;
    rounds = 1;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0)
      continue;
    if (i + 1 >= argc)
      die("unknown option or missing value: %s (options: --iterations N, "
          "--per-turn N, --rounds N, --history-cap BYTES, --only VARIANT, "
          "--quick)",
          a);
    if (strcmp(a, "--iterations") == 0)
      iterations = parse_long(a, argv[++i], 10);
    else if (strcmp(a, "--per-turn") == 0)
      per_turn = parse_long(a, argv[++i], 2);
    else if (strcmp(a, "--rounds") == 0)
      rounds = parse_long(a, argv[++i], 1);
    else if (strcmp(a, "--history-cap") == 0)
      history_cap = (size_t)parse_long(a, argv[++i], 1);
    else if (strcmp(a, "--only") == 0)
      only = argv[++i];
    else
      die("unknown option %s", a);
  }
  if (rounds > MAX_ROUNDS)
    die("--rounds: at most %d", MAX_ROUNDS);
  if (iterations % per_turn != 0)
    die("--iterations (%ld) must be a multiple of --per-turn (%ld)", iterations,
        per_turn);
  if (iterations % SEGMENTS != 0)
    die("--iterations (%ld) must be a multiple of %d", iterations, SEGMENTS);

  variant vs[] = {
      {.name = "multi_turn",
       .key = "session=multi_turn",
       .label = "multi-turn",
       .events = EV_NONE},
      {.name = "single_turn",
       .key = "session=single_turn",
       .label = "single turn",
       .single = true,
       .events = EV_NONE},
      {.name = "events_noop",
       .key = "session=multi_turn events=noop",
       .label = "multi-turn, events to a no-op",
       .events = EV_NOOP},
      {.name = "events_json",
       .key = "session=multi_turn events=json",
       .label = "multi-turn, events json_dumps'd",
       .events = EV_JSON},
  };
  int nv = (int)(sizeof(vs) / sizeof(vs[0]));
  if (only != NULL) {
    int k = 0;
    while (k < nv && strcmp(only, vs[k].name) != 0)
      k++;
    if (k == nv)
      die("--only: one of multi_turn, single_turn, events_noop, "
          "events_json");
  }

  printf("agent loop overhead: an instant model and an instant native tool\n");
  printf("  default preset, loop.max_iterations 0, loop.max_turn_duration 0;"
         " an iteration is a model request\n");
  printf("  multi-turn: %ld turns of %ld iterations (%ld tool calls each), "
         "max_history_bytes %zu KiB\n",
         iterations / per_turn, per_turn, per_turn - 1, history_cap >> 10);
  printf("  single turn: 1 turn of %ld iterations\n", iterations);
  printf("  %ld round(s), median reported\n\n", rounds);
  fflush(stdout);

  /* 1. Memory, untimed, first (so the single turn does not inflate the
   * RSS): after ag_agent_new and after 1e3, 1e4, 1e5 iterations. */
  session mem;
  memset(&mem, 0, sizeof(mem));
  long cps[3];
  int n_cps = 0;
  for (long c = 1000; c <= iterations && n_cps < 3; c *= 10)
    cps[n_cps++] = c;
  long peak_multi = -1;
  if (only == NULL) {
    mem.iterations = iterations;
    mem.per_turn = per_turn;
    mem.history_cap = history_cap;
    mem.checkpoints = cps;
    mem.n_checkpoints = n_cps;
    run_session(&mem);
    peak_multi = peak_rss_kib();
  }

  /* 2. Rounds: every variant once per round, back to back. */
  for (long r = 0; r < rounds; r++) {
    for (int v = 0; v < nv; v++) {
      if (only != NULL && strcmp(only, vs[v].name) != 0)
        continue;
      session s;
      memset(&s, 0, sizeof(s));
      s.iterations = iterations;
      s.per_turn = vs[v].single ? iterations : per_turn;
      s.history_cap = history_cap;
      s.events = vs[v].events;
      s.segments = vs[v].single;
      run_session(&s);
      vs[v].ran = true;
      vs[v].us[r] = s.us_per_iteration;
      for (int k = 0; k < SEGMENTS; k++)
        vs[v].seg[k][r] = s.seg_us[k];
      vs[v].last = s;
    }
  }
  long peak_all = peak_rss_kib();

  /* 3. The cost of one turn by the size of the stored history. */
  static const long builds[] = {0, 1000, 4000, 30000};
  int n_builds = only == NULL ? (int)(sizeof(builds) / sizeof(builds[0])) : 0;
  double tc[sizeof(builds) / sizeof(builds[0])];
  size_t tc_bytes[sizeof(builds) / sizeof(builds[0])];
  for (int i = 0; i < n_builds; i++)
    tc[i] = turn_cost(builds[i], quick ? 5 : 21, &tc_bytes[i]);

  /* Report. */
  double med[sizeof(vs) / sizeof(vs[0])];
  printf("us per iteration (median of %ld round(s); min-max)\n", rounds);
  for (int v = 0; v < nv; v++) {
    if (!vs[v].ran)
      continue;
    double lo = vs[v].us[0], hi = vs[v].us[0];
    for (long r = 1; r < rounds; r++) {
      lo = vs[v].us[r] < lo ? vs[v].us[r] : lo;
      hi = vs[v].us[r] > hi ? vs[v].us[r] : hi;
    }
    med[v] = median(vs[v].us, (int)rounds);
    printf("  %-34s %8.2f   (%.2f-%.2f)\n", vs[v].label, med[v], lo, hi);
  }
  const session *noop = &vs[2].last, *js = &vs[3].last;
  if (vs[2].ran && vs[3].ran)
    printf("  events: %.2f per iteration, %.0f bytes per iteration as JSON\n",
           (double)noop->events_seen / (double)iterations,
           (double)js->event_bytes / (double)iterations);
  double seg_med[SEGMENTS];
  if (vs[1].ran) {
    printf("\nsingle turn: us per iteration in each stretch of %ld requests "
           "(the turn's end excluded)\n ",
           iterations / SEGMENTS);
    for (int k = 0; k < SEGMENTS; k++) {
      seg_med[k] = median(vs[1].seg[k], (int)rounds);
      printf(" %.2f", seg_med[k]);
    }
    printf("\n");
  }
  if (n_builds > 0) {
    printf("\none turn of one iteration (a request, the final answer) by "
           "the stored history,\ndefault max_history_bytes (8 MiB); median "
           "of %d turns\n",
           quick ? 5 : 21);
    printf("  %14s %12s\n", "history (B)", "us per turn");
    for (int i = 0; i < n_builds; i++)
      printf("  %14zu %12.1f\n", tc_bytes[i], tc[i]);
  }
  if (only == NULL) {
    printf("\nmemory (heap: bytes malloc has handed out since just before "
           "the session's\nregistry and agent were made; RSS: whole process; "
           "history: compact JSON)\n");
    printf("  %-30s %13s %10s %12s %9s\n", "", "heap (bytes)", "RSS (KiB)",
           "history (B)", "messages");
    print_mem_row("multi-turn, after new", &mem.points[0]);
    for (int i = 1; i < mem.n_points; i++) {
      char label[64];
      snprintf(label, sizeof(label), "multi-turn, %ld iterations",
               mem.points[i].iterations);
      print_mem_row(label, &mem.points[i]);
    }
  }
  if (vs[1].ran) {
    char label[64];
    snprintf(label, sizeof(label), "single turn, %ld iterations", iterations);
    if (only != NULL)
      printf("\n");
    print_mem_row(label, &vs[1].last.end);
  }
  if (only == NULL)
    printf("  peak RSS: %ld KiB after the multi-turn session, %ld KiB at the "
           "end (single turn included)\n",
           peak_multi, peak_all);

  /* Machine-readable. */
  printf("\n");
  for (int v = 0; v < nv; v++)
    if (vs[v].ran)
      printf("agent_us_per_iteration %s value=%.3f\n", vs[v].key, med[v]);
  if (vs[1].ran)
    for (int k = 0; k < SEGMENTS; k++)
      printf("agent_us_per_iteration session=single_turn segment=%d "
             "value=%.3f\n",
             k + 1, seg_med[k]);
  if (vs[2].ran && vs[3].ran) {
    printf("agent_events_per_iteration value=%.3f\n",
           (double)noop->events_seen / (double)iterations);
    printf("agent_event_bytes_per_iteration value=%.1f\n",
           (double)js->event_bytes / (double)iterations);
  }
  for (int i = 0; i < n_builds; i++)
    printf("agent_us_per_turn history_bytes=%zu value=%.1f\n", tc_bytes[i],
           tc[i]);
  if (only == NULL)
    for (int i = 0; i < mem.n_points; i++)
      print_mem_lines("multi_turn", &mem.points[i]);
  if (vs[1].ran)
    print_mem_lines("single_turn", &vs[1].last.end);
  if (only == NULL)
    printf("agent_peak_rss_kib session=multi_turn value=%ld\n", peak_multi);
  printf("agent_peak_rss_kib value=%ld\n", peak_all);
  return 0;
}
