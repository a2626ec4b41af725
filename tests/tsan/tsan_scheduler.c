/*
 * tests/tsan/tsan_scheduler.c - parallel batches on the scheduler's pool, as
 * a plain program for ThreadSanitizer (tests/runtime/test_scheduler.c holds
 * the rest of the scheduler's behaviour):
 *   1. 8 native calls finishing out of order, with max_parallel 4 and 8:
 *      results in the calls' order, at most max_parallel running at once,
 *      on_attempt events counted under a mutex, all on pool threads;
 *   2. a turn deadline that expires while 4 calls hang;
 *   3. a caller cancel from another thread, then a batch on the cancelled
 *      turn that runs nothing;
 *   4. a flaky tool retried on pool threads;
 *   5. subprocess tools in a parallel batch (one of them timing out);
 *   6. many batches of varying sizes on one scheduler, from two threads
 *      in turn, with session approvals asked on the calling thread;
 * each ending with ag_scheduler_free. Exits 0 when every check holds; the
 * first failed check prints both sides and exits 1.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "exec/internal.h"
#include "tsan_common.h"

#define MAX_EVENTS 256

static void start(pthread_t *th, void *(*fn)(void *), void *arg) {
  int rc = pthread_create(th, NULL, fn, arg);
  CHECK(rc == 0, "pthread_create: %d", rc);
}

/* ------------------------------------------------------------------------ */
/* The tools' shared state and the attempt events, all under one mutex     */
/* ------------------------------------------------------------------------ */

typedef struct probe {
  pthread_mutex_t mu;
  int runs;          /* tool executions (attempts) */
  int running, peak; /* tools running at once, and the most seen */
  char order[64];    /* sleep tags in completion order */
  int on_caller;     /* executions on the thread that called run */
  int flaky_attempts[16];
  /* attempt events */
  int events;
  int per_call[64];
  int events_on_caller;
  int events_ok;
} probe;

static probe P = {.mu = PTHREAD_MUTEX_INITIALIZER};
/* The thread inside ag_scheduler_run; written before each run, read by
 * tools and callbacks under P.mu. */
static pthread_t caller;

static void probe_reset(void) {
  pthread_mutex_lock(&P.mu);
  P.runs = P.running = P.peak = P.on_caller = 0;
  memset(P.order, 0, sizeof(P.order));
  memset(P.flaky_attempts, 0, sizeof(P.flaky_attempts));
  P.events = P.events_on_caller = P.events_ok = 0;
  memset(P.per_call, 0, sizeof(P.per_call));
  caller = pthread_self();
  pthread_mutex_unlock(&P.mu);
}

static void enter(void) {
  pthread_mutex_lock(&P.mu);
  P.runs++;
  if (++P.running > P.peak)
    P.peak = P.running;
  if (pthread_equal(pthread_self(), caller))
    P.on_caller++;
  pthread_mutex_unlock(&P.mu);
}

static void leave(const char *tag) {
  pthread_mutex_lock(&P.mu);
  P.running--;
  if (tag != NULL && strlen(P.order) + strlen(tag) < sizeof(P.order))
    strcat(P.order, tag);
  pthread_mutex_unlock(&P.mu);
}

/* {"ms": N, "tag": "x"}: waits N ms on its token (-1: until cancelled),
 * then answers the tag. */
static ag_tool_status sleep_tool(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  json_int_t ms = json_integer_value(json_object_get(args, "ms"));
  const char *tag = json_string_value(json_object_get(args, "tag"));
  enter();
  ag_cancel_reason r = ag_cancel_wait(cancel, ms < 0 ? -1 : (int64_t)ms);
  if (r != AG_CANCEL_NONE) {
    leave(NULL);
    return r == AG_CANCEL_TIMEOUT ? AG_TOOL_TIMEOUT : AG_TOOL_CANCELLED;
  }
  leave(tag);
  ag_output_printf(out, "%s", tag != NULL ? tag : "done");
  return AG_TOOL_OK;
}

/* Answers its arguments as compact JSON with sorted keys. */
static ag_tool_status echo_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  enter();
  char *s = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
  leave(NULL);
  if (s == NULL)
    return AG_TOOL_ERROR;
  ag_output_write(out, s, strlen(s));
  free(s);
  return AG_TOOL_OK;
}

/* {"id": K}: a transient error on the first two attempts of id K, then
 * success. */
static ag_tool_status flaky_tool(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  json_int_t id = json_integer_value(json_object_get(args, "id"));
  if (id < 0 || id >= 16)
    return AG_TOOL_ERROR;
  enter();
  pthread_mutex_lock(&P.mu);
  int attempt = ++P.flaky_attempts[id];
  pthread_mutex_unlock(&P.mu);
  ag_cancel_wait(cancel, 5);
  leave(NULL);
  if (attempt < 3) {
    ag_output_printf(out, "Connection refused (attempt %d)", attempt);
    ag_output_set_transient(out, true);
    return AG_TOOL_ERROR;
  }
  ag_output_printf(out, "ok on attempt %d", attempt);
  return AG_TOOL_OK;
}

static void on_attempt(void *user, const ag_attempt *a) {
  probe *p = user;
  pthread_mutex_lock(&p->mu);
  p->events++;
  if (a->call_index >= 0 && a->call_index < 64)
    p->per_call[a->call_index]++;
  if (a->outcome == AG_TOOL_OK)
    p->events_ok++;
  if (pthread_equal(pthread_self(), caller))
    p->events_on_caller++;
  pthread_mutex_unlock(&p->mu);
}

/* Session approvals: asked on the calling thread only. */
typedef struct asked {
  int count;
  int off_caller;
} asked;

static ag_approval approve(void *user, const char *tool, const char *args,
                           size_t args_len, char *reason, size_t reason_cap) {
  (void)tool;
  (void)args;
  (void)args_len;
  (void)reason;
  (void)reason_cap;
  asked *a = user;
  /* phase 1 runs on the caller's thread, never with a pool thread */
  a->count++;
  pthread_mutex_lock(&P.mu);
  if (!pthread_equal(pthread_self(), caller))
    a->off_caller++;
  pthread_mutex_unlock(&P.mu);
  return AG_APPROVE_SESSION;
}

/* ------------------------------------------------------------------------ */
/* Registry, scheduler, batches                                             */
/* ------------------------------------------------------------------------ */

static void add_tool(ag_registry *reg, ag_tool_def *d) {
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_registry_add(reg, d, &err);
  CHECK(rc == AG_OK, "add %s: %s (%s)", d->name, ag_err_name(rc), err.msg);
}

static const char *cat_argv[] = {"cat", NULL};
static const char *slow_argv[] = {"sh", "-c", "sleep 0.05; echo slow", NULL};
static const char *fail_argv[] = {"sh", "-c", "echo 'bad input' >&2; exit 3",
                                  NULL};
static const char *hang_argv[] = {"sleep", "10", NULL};

static ag_registry *make_registry(void) {
  ag_registry *reg = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_registry_new(&reg, &err);
  CHECK(rc == AG_OK, "ag_registry_new: %s (%s)", ag_err_name(rc), err.msg);
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "danger";
  d.fn = echo_tool;
  d.requires_approval = true;
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "echo";
  d.fn = echo_tool;
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "flaky";
  d.fn = flaky_tool;
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "sleep";
  d.fn = sleep_tool;
  d.parameters = "{\"type\":\"object\",\"properties\":{\"ms\":{\"type\":"
                 "\"integer\"},\"tag\":{\"type\":\"string\"}}}";
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "sp_cat";
  d.argv = cat_argv;
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "sp_slow";
  d.argv = slow_argv;
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "sp_fail";
  d.argv = fail_argv;
  d.max_retries = 0;
  add_tool(reg, &d);
  ag_tool_def_init(&d);
  d.name = "sp_hang";
  d.argv = hang_argv;
  d.timeout_ms = 50;
  d.max_retries = 0;
  d.kill_grace_ms = 3000;
  add_tool(reg, &d);
  return reg;
}

static ag_config make_config(int max_parallel) {
  ag_config cfg;
  ag_config_init(&cfg);
  cfg.loop.parallel = true;
  cfg.loop.max_parallel = max_parallel;
  cfg.retry.max_retries = 3;
  cfg.retry.delay_ms = 1;
  cfg.retry.max_delay_ms = 5;
  cfg.retry.function_timeout_ms = 10000;
  return cfg;
}

static ag_scheduler *make_scheduler(const ag_registry *reg, int max_parallel,
                                    asked *approvals) {
  ag_config cfg = make_config(max_parallel);
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.on_attempt = on_attempt;
  o.attempt_user = &P;
  o.jitter_seed = 42;
  if (approvals != NULL) {
    o.approve = approve;
    o.approve_user = approvals;
  }
  ag_scheduler *s = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_scheduler_new(&s, reg, &cfg, &o, &err);
  CHECK(rc == AG_OK && s != NULL, "ag_scheduler_new: %s (%s)", ag_err_name(rc),
        err.msg);
  return s;
}

static ag_exec_call call(const char *name, const char *args) {
  ag_exec_call c = {name, args, strlen(args), false, NULL};
  return c;
}

static void run(ag_scheduler *s, const ag_exec_call *calls, size_t n,
                ag_cancel *turn, ag_exec_result *results) {
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_scheduler_run(s, calls, n, turn, results, &err);
  CHECK(rc == AG_OK, "ag_scheduler_run: %s (%s)", ag_err_name(rc), err.msg);
}

static void clear_all(ag_exec_result *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    ag_exec_result_clear(&r[i]);
}

#define CHECK_RESULT(r, want_status, want_text, ...)                           \
  do {                                                                         \
    const char *t_ = (r).text != NULL ? (r).text : "(null)";                   \
    char who_[96];                                                             \
    snprintf(who_, sizeof(who_), __VA_ARGS__);                                 \
    CHECK((r).status == (want_status), "%s: status %s, want %s (text \"%s\")", \
          who_, ag_exec_status_name((r).status),                               \
          ag_exec_status_name(want_status), t_);                               \
    CHECK(strcmp(t_, (want_text)) == 0, "%s: text \"%s\", want \"%s\"", who_,  \
          t_, (want_text));                                                    \
  } while (0)

/* ------------------------------------------------------------------------ */
/* 1. Eight calls finishing out of order                                    */
/* ------------------------------------------------------------------------ */

static void out_of_order(const ag_registry *reg, int max_parallel) {
  probe_reset();
  ag_scheduler *s = make_scheduler(reg, max_parallel, NULL);
  /* "a" takes longest and "b" shortest: b must finish before a */
  static const int ms[8] = {160, 20, 120, 40, 140, 60, 100, 80};
  char args[8][48], tags[8][2];
  ag_exec_call calls[8];
  for (int i = 0; i < 8; i++) {
    tags[i][0] = (char)('a' + i);
    tags[i][1] = '\0';
    snprintf(args[i], sizeof(args[i]), "{\"ms\":%d,\"tag\":\"%s\"}", ms[i],
             tags[i]);
    calls[i] = call("sleep", args[i]);
  }
  ag_exec_result r[8];
  long long t0 = tsan_now_ms();
  run(s, calls, 8, NULL, r);
  long long took = tsan_now_ms() - t0;
  for (int i = 0; i < 8; i++) {
    CHECK_RESULT(r[i], AG_EXEC_OK, tags[i], "max_parallel %d, call %d",
                 max_parallel, i);
    CHECK(r[i].attempts == 1, "call %d: %d attempts, want 1", i, r[i].attempts);
  }
  clear_all(r, 8);
  pthread_mutex_lock(&P.mu);
  CHECK(P.runs == 8, "max_parallel %d: %d runs, want 8", max_parallel, P.runs);
  CHECK(P.peak <= max_parallel && P.peak >= 2,
        "max_parallel %d: up to %d calls ran at once, want 2..%d", max_parallel,
        P.peak, max_parallel);
  CHECK(P.on_caller == 0, "%d call(s) of a parallel batch ran on the caller",
        P.on_caller);
  const char *a = strchr(P.order, 'a'), *b = strchr(P.order, 'b');
  CHECK(strlen(P.order) == 8 && a != NULL && b != NULL && b < a,
        "completion order \"%s\": want all 8, \"b\" (20 ms) before \"a\" "
        "(160 ms)",
        P.order);
  CHECK(P.events == 8 && P.events_ok == 8, "events %d (ok %d), want 8 and 8",
        P.events, P.events_ok);
  for (int i = 0; i < 8; i++)
    CHECK(P.per_call[i] == 1, "call %d: %d attempt events, want 1", i,
          P.per_call[i]);
  CHECK(P.events_on_caller == 0, "%d attempt event(s) on the caller's thread",
        P.events_on_caller);
  pthread_mutex_unlock(&P.mu);
  CHECK(took < 5000, "max_parallel %d: 8 calls of at most 160 ms took %lld ms",
        max_parallel, took);
  ag_scheduler_free(s);
}

/* ------------------------------------------------------------------------ */
/* 2, 3. Turn deadline and caller cancel                                    */
/* ------------------------------------------------------------------------ */

static void deadline_while_hanging(const ag_registry *reg) {
  probe_reset();
  ag_scheduler *s = make_scheduler(reg, 8, NULL);
  ag_cancel *turn = NULL;
  long long t0 = tsan_now_ms();
  ag_err_t rc =
      ag_cancel_new(&turn, NULL, ag_now_ms() + 100, AG_CANCEL_DEADLINE, NULL);
  CHECK(rc == AG_OK, "ag_cancel_new: %s", ag_err_name(rc));
  ag_exec_call calls[4];
  for (int i = 0; i < 4; i++)
    calls[i] = call("sleep", "{\"ms\":-1}");
  ag_exec_result r[4];
  run(s, calls, 4, turn, r);
  long long took = tsan_now_ms() - t0;
  for (int i = 0; i < 4; i++)
    CHECK_RESULT(r[i], AG_EXEC_CANCELLED, "Cancelled: turn deadline passed",
                 "hanging call %d", i);
  clear_all(r, 4);
  pthread_mutex_lock(&P.mu);
  CHECK(P.runs == 4, "%d runs, want 4: each ran once, none retried", P.runs);
  CHECK(P.running == 0, "%d tool(s) still running after the batch", P.running);
  pthread_mutex_unlock(&P.mu);
  CHECK(took >= 95 && took < 5000,
        "the batch returned %lld ms after the start, deadline 100 ms", took);
  ag_cancel_free(turn);
  ag_scheduler_free(s);
}

typedef struct canceller {
  ag_cancel *turn;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  tsan_sleep_ms(c->after_ms);
  ag_cancel_cancel(c->turn, AG_CANCEL_USER);
  return NULL;
}

static void caller_cancel(const ag_registry *reg) {
  probe_reset();
  ag_scheduler *s = make_scheduler(reg, 4, NULL);
  ag_cancel *turn = NULL;
  ag_err_t rc = ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL);
  CHECK(rc == AG_OK, "ag_cancel_new: %s", ag_err_name(rc));
  canceller c = {turn, 80};
  pthread_t th;
  long long t0 = tsan_now_ms();
  start(&th, cancel_later, &c);
  ag_exec_call calls[6] = {
      call("sleep", "{\"ms\":-1}"), call("echo", "{\"n\":1}"),
      call("sleep", "{\"ms\":-1}"), call("sleep", "{\"ms\":-1}"),
      call("echo", "{\"n\":2}"),    call("sleep", "{\"ms\":-1}"),
  };
  ag_exec_result r[6];
  run(s, calls, 6, turn, r);
  long long took = tsan_now_ms() - t0;
  pthread_join(th, NULL);
  for (int i = 0; i < 6; i++) {
    if (strcmp(calls[i].name, "echo") == 0) {
      /* the echoes may have to wait for a free thread, and so may start
       * after the cancel; either way they never hang */
      CHECK(r[i].status == AG_EXEC_OK || r[i].status == AG_EXEC_CANCELLED,
            "echo call %d: status %s (text \"%s\")", i,
            ag_exec_status_name(r[i].status), r[i].text);
    } else {
      CHECK_RESULT(r[i], AG_EXEC_CANCELLED, "Cancelled by the caller",
                   "hanging call %d", i);
    }
  }
  clear_all(r, 6);
  CHECK(took < 5000, "cancelled after 80 ms, the batch returned after %lld ms",
        took);

  /* the token stays cancelled: the next batch starts nothing */
  probe_reset();
  ag_exec_call two[2] = {call("echo", "{}"), call("sleep", "{\"ms\":1}")};
  run(s, two, 2, turn, r);
  for (int i = 0; i < 2; i++) {
    CHECK_RESULT(r[i], AG_EXEC_CANCELLED, "Cancelled by the caller",
                 "call %d on a cancelled turn", i);
    CHECK(r[i].attempts == 0, "call %d on a cancelled turn: %d attempts", i,
          r[i].attempts);
  }
  clear_all(r, 2);
  pthread_mutex_lock(&P.mu);
  CHECK(P.runs == 0, "%d run(s) on a cancelled turn", P.runs);
  pthread_mutex_unlock(&P.mu);
  ag_cancel_free(turn);
  ag_scheduler_free(s);
}

/* ------------------------------------------------------------------------ */
/* 4. Retries on pool threads                                               */
/* ------------------------------------------------------------------------ */

static void flaky_on_the_pool(const ag_registry *reg) {
  probe_reset();
  ag_scheduler *s = make_scheduler(reg, 4, NULL);
  ag_exec_call calls[6] = {
      call("flaky", "{\"id\":1}"),
      call("sleep", "{\"ms\":20,\"tag\":\"x\"}"),
      call("flaky", "{\"id\":2}"),
      call("flaky", "{\"id\":3}"),
      call("sleep", "{\"ms\":20,\"tag\":\"y\"}"),
      call("flaky", "{\"id\":4}"),
  };
  ag_exec_result r[6];
  run(s, calls, 6, NULL, r);
  int flaky_calls[4] = {0, 2, 3, 5};
  for (int k = 0; k < 4; k++) {
    int i = flaky_calls[k];
    CHECK_RESULT(r[i], AG_EXEC_OK, "ok on attempt 3", "flaky call %d", i);
    CHECK(r[i].attempts == 3, "flaky call %d: %d attempts, want 3", i,
          r[i].attempts);
  }
  CHECK_RESULT(r[1], AG_EXEC_OK, "x", "sleep call 1");
  CHECK_RESULT(r[4], AG_EXEC_OK, "y", "sleep call 4");
  clear_all(r, 6);
  pthread_mutex_lock(&P.mu);
  CHECK(P.events == 4 * 3 + 2 && P.events_ok == 6,
        "attempt events %d (ok %d), want 14 (ok 6)", P.events, P.events_ok);
  for (int k = 0; k < 4; k++)
    CHECK(P.per_call[flaky_calls[k]] == 3, "flaky call %d: %d events, want 3",
          flaky_calls[k], P.per_call[flaky_calls[k]]);
  CHECK(P.on_caller == 0 && P.events_on_caller == 0,
        "%d run(s) and %d event(s) on the caller's thread", P.on_caller,
        P.events_on_caller);
  CHECK(P.peak <= 4, "%d calls at once with max_parallel 4", P.peak);
  pthread_mutex_unlock(&P.mu);
  ag_scheduler_free(s);
}

/* ------------------------------------------------------------------------ */
/* 5. Subprocess tools in a parallel batch                                  */
/* ------------------------------------------------------------------------ */

static void subprocesses_in_a_batch(const ag_registry *reg) {
  probe_reset();
  ag_scheduler *s = make_scheduler(reg, 4, NULL);
  ag_exec_call calls[6] = {
      call("sp_slow", "{}"),
      call("sp_cat", "{\"q\": \"hello\"}"),
      call("sleep", "{\"ms\":10,\"tag\":\"n\"}"),
      call("sp_fail", "{}"),
      call("sp_hang", "{}"),
      call("sp_slow", "{}"),
  };
  ag_exec_result r[6];
  long long t0 = tsan_now_ms();
  run(s, calls, 6, NULL, r);
  long long took = tsan_now_ms() - t0;
  CHECK_RESULT(r[0], AG_EXEC_OK, "slow\n", "sp_slow call 0");
  CHECK_RESULT(r[1], AG_EXEC_OK, "{\"q\": \"hello\"}", "sp_cat call 1");
  CHECK_RESULT(r[2], AG_EXEC_OK, "n", "sleep call 2");
  CHECK_RESULT(r[3], AG_EXEC_ERROR, "bad input", "sp_fail call 3");
  CHECK_RESULT(r[4], AG_EXEC_TIMEOUT, "Function timed out after 50ms",
               "sp_hang call 4");
  CHECK_RESULT(r[5], AG_EXEC_OK, "slow\n", "sp_slow call 5");
  clear_all(r, 6);
  /* sp_hang's 3 s grace would show here if SIGTERM did not end it */
  CHECK(took < 2500, "the batch took %lld ms", took);
  ag_scheduler_free(s);
}

/* ------------------------------------------------------------------------ */
/* 6. Many batches on one scheduler, from two threads in turn               */
/* ------------------------------------------------------------------------ */

typedef struct batches {
  ag_scheduler *s;
  int first, last; /* rounds */
} batches;

static void *run_batches(void *arg) {
  batches *b = arg;
  pthread_mutex_lock(&P.mu);
  caller = pthread_self();
  pthread_mutex_unlock(&P.mu);
  enum { MAX = 16 };
  char args[MAX][48], want[MAX][48];
  ag_exec_call calls[MAX];
  ag_exec_result r[MAX];
  for (int round = b->first; round < b->last; round++) {
    size_t n = (size_t)(round % MAX) + 1;
    for (size_t i = 0; i < n; i++) {
      switch ((round + (int)i) % 3) {
      case 0:
        snprintf(args[i], sizeof(args[i]), "{\"i\":%zu,\"r\":%d}", i, round);
        memcpy(want[i], args[i], sizeof(want[i]));
        calls[i] = call("echo", args[i]);
        break;
      case 1:
        snprintf(args[i], sizeof(args[i]), "{\"ms\":%d,\"tag\":\"t%zu\"}",
                 (round + (int)i) % 4, i);
        snprintf(want[i], sizeof(want[i]), "t%zu", i);
        calls[i] = call("sleep", args[i]);
        break;
      default:
        snprintf(args[i], sizeof(args[i]), "{\"d\":%zu}", i);
        memcpy(want[i], args[i], sizeof(want[i]));
        calls[i] = call("danger", args[i]);
        break;
      }
    }
    run(b->s, calls, n, NULL, r);
    for (size_t i = 0; i < n; i++)
      CHECK_RESULT(r[i], AG_EXEC_OK, want[i], "round %d call %zu (%s)", round,
                   i, calls[i].name);
    clear_all(r, n);
  }
  return NULL;
}

static void many_batches(const ag_registry *reg) {
  probe_reset();
  asked approvals = {0, 0};
  ag_scheduler *s = make_scheduler(reg, 4, &approvals);
  /* one thread at a time, but not always the same one */
  batches first = {s, 0, 25};
  run_batches(&first);
  batches second = {s, 25, 50};
  pthread_t th;
  start(&th, run_batches, &second);
  pthread_join(th, NULL);
  CHECK(approvals.count == 1,
        "\"allow for the session\" asked %d times, want once", approvals.count);
  CHECK(approvals.off_caller == 0, "%d approval(s) asked off the caller",
        approvals.off_caller);
  pthread_mutex_lock(&P.mu);
  CHECK(P.running == 0, "%d tool(s) still running", P.running);
  pthread_mutex_unlock(&P.mu);
  ag_scheduler_free(s);
}

int main(void) {
  long long t0 = tsan_now_ms();
  ag_registry *reg = make_registry();
  out_of_order(reg, 4);
  out_of_order(reg, 8);
  deadline_while_hanging(reg);
  caller_cancel(reg);
  flaky_on_the_pool(reg);
  subprocesses_in_a_batch(reg);
  many_batches(reg);
  /* idle schedulers: the pool starts and stops with nothing to do */
  for (int par = 1; par <= 16; par *= 2)
    ag_scheduler_free(make_scheduler(reg, par, NULL));
  ag_registry_free(reg);
  printf("tsan_scheduler: ok (%lld ms)\n", tsan_now_ms() - t0);
  return 0;
}
