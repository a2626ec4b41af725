/*
 * tests/tsan/tsan_retry.c - the retry executor (ag__exec_call) called from
 * several threads at once with one shared configuration and shared tools,
 * as a plain program for ThreadSanitizer (tests/runtime/test_retry.c holds
 * the single-call behaviour):
 *   1. a flaky native tool retried with jittered backoff on 6 threads, each
 *      with its own rng; on_attempt arrives on the thread that ran the call;
 *   2. a caller cancel of a shared root token while 6 calls sit in 10 s
 *      retry waits (some on the root itself, some on a child turn token);
 *   3. a turn deadline expiring during those waits;
 *   4. per-attempt timeouts of a hanging tool on 6 threads, retried only
 *      where the tool is idempotent;
 *   5. subprocess tools (cat, a transient failure) from 4 threads.
 * Exits 0 when every check holds; the first failed check prints both sides
 * and exits 1.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "exec/internal.h"
#include "tsan_common.h"

#define THREADS 6
#define CALLS 10 /* per thread, scenario 1 */

static void start(pthread_t *th, void *(*fn)(void *), void *arg) {
  int rc = pthread_create(th, NULL, fn, arg);
  CHECK(rc == 0, "pthread_create: %d", rc);
}

/* The "none" preset with retries on: max_retries, `delay_ms` constant. */
static ag_config retry_config(int max_retries, int64_t delay_ms) {
  ag_config cfg;
  ag_error_t err;
  ag_error_clear(&err);
  CHECK(ag_config_preset(&cfg, "none", &err) == AG_OK, "preset: %s", err.msg);
  cfg.retry.max_retries = max_retries;
  cfg.retry.delay_ms = delay_ms;
  cfg.retry.backoff = AG_BACKOFF_CONSTANT;
  cfg.retry.max_delay_ms = 0;
  cfg.retry.jitter = false;
  cfg.retry.function_timeout_ms = 0;
  cfg.retry.retry_on = AG_RETRY_ON_TRANSIENT;
  return cfg;
}

static ag__tool native_tool(const char *name, ag_tool_fn fn, void *user) {
  ag__tool t;
  memset(&t, 0, sizeof(t));
  t.def.name = name;
  t.def.idempotent = true;
  t.def.timeout_ms = -1;
  t.def.max_retries = -1;
  t.def.fn = fn;
  t.def.user = user;
  return t;
}

#define CHECK_RESULT(r, want_status, want_text, who)                           \
  do {                                                                         \
    const char *t_ = (r).text != NULL ? (r).text : "(null)";                   \
    CHECK((r).status == (want_status), "%s: status %s, want %s (text \"%s\")", \
          (who), ag_exec_status_name((r).status),                              \
          ag_exec_status_name(want_status), t_);                               \
    CHECK(strcmp(t_, (want_text)) == 0, "%s: text \"%s\", want \"%s\"", (who), \
          t_, (want_text));                                                    \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Shared state of the tools and of the attempt events                      */
/* ------------------------------------------------------------------------ */

#define MAX_IDS (THREADS * CALLS)

typedef struct shared {
  pthread_mutex_t mu;
  pthread_cond_t changed;
  int tool_attempts[MAX_IDS]; /* flaky: attempts per call id */
  int events[MAX_IDS];        /* on_attempt per call index */
  int events_total;
  pthread_t caller[MAX_IDS];    /* the thread that made each call */
  int wrong_thread;             /* events not on the calling thread */
  int bad_delay;                /* retry_in_ms out of range */
  int64_t min_delay, max_delay; /* allowed retry_in_ms of a retried attempt */
} shared;

static shared S = {.mu = PTHREAD_MUTEX_INITIALIZER,
                   .changed = PTHREAD_COND_INITIALIZER};

static void shared_reset(int64_t min_delay, int64_t max_delay) {
  pthread_mutex_lock(&S.mu);
  memset(S.tool_attempts, 0, sizeof(S.tool_attempts));
  memset(S.events, 0, sizeof(S.events));
  S.events_total = 0;
  S.wrong_thread = 0;
  S.bad_delay = 0;
  S.min_delay = min_delay;
  S.max_delay = max_delay;
  pthread_mutex_unlock(&S.mu);
}

static void on_attempt(void *user, const ag_attempt *a) {
  shared *s = user;
  pthread_mutex_lock(&s->mu);
  s->events_total++;
  if (a->call_index >= 0 && a->call_index < MAX_IDS) {
    s->events[a->call_index]++;
    if (!pthread_equal(s->caller[a->call_index], pthread_self()))
      s->wrong_thread++;
  }
  if (a->retry_in_ms != -1 &&
      (a->retry_in_ms < s->min_delay || a->retry_in_ms > s->max_delay))
    s->bad_delay++;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* 1. A flaky tool retried on 6 threads                                     */
/* ------------------------------------------------------------------------ */

/* {"id": K}: a transient error on the first two attempts of call K (one
 * by its text, one by the tool's own mark), then success. */
static ag_tool_status flaky(void *user, const json_t *args, ag_cancel *cancel,
                            ag_output *out) {
  shared *s = user;
  json_int_t id = json_integer_value(json_object_get(args, "id"));
  if (id < 0 || id >= MAX_IDS) {
    ag_output_printf(out, "bad id %lld", (long long)id);
    ag_output_set_transient(out, false);
    return AG_TOOL_ERROR;
  }
  pthread_mutex_lock(&s->mu);
  int attempt = ++s->tool_attempts[id];
  pthread_mutex_unlock(&s->mu);
  if (ag_cancel_check(cancel, ag_now_ms()) != AG_CANCEL_NONE)
    return AG_TOOL_CANCELLED;
  if (attempt == 1) {
    ag_output_printf(out, "Connection refused");
    return AG_TOOL_ERROR;
  }
  if (attempt == 2) {
    ag_output_printf(out, "upstream hiccup %lld", (long long)id);
    ag_output_set_transient(out, true);
    return AG_TOOL_ERROR;
  }
  ag_output_printf(out, "ok %lld on attempt %d", (long long)id, attempt);
  return AG_TOOL_OK;
}

typedef struct worker {
  int index;
  const ag__tool *tool;
  const ag_config *cfg;
  ag_cancel *turn;
  ag_exec_result res[CALLS];
  long long took_ms;
} worker;

static void *flaky_worker(void *arg) {
  worker *w = arg;
  uint64_t rng = 0x5EED0000u + (uint64_t)w->index;
  for (int k = 0; k < CALLS; k++) {
    int id = w->index * CALLS + k;
    pthread_mutex_lock(&S.mu);
    S.caller[id] = pthread_self();
    pthread_mutex_unlock(&S.mu);
    char args[32];
    int len = snprintf(args, sizeof(args), "{\"id\":%d}", id);
    json_t *parsed = json_loads(args, 0, NULL);
    CHECK(parsed != NULL, "parse %s", args);
    ag_err_t rc = ag__exec_call(&(ag__call){.tool = w->tool,
                                            .cfg = w->cfg,
                                            .args = args,
                                            .args_len = (size_t)len,
                                            .parsed = parsed,
                                            .turn = w->turn,
                                            .call_index = id,
                                            .on_attempt = on_attempt,
                                            .attempt_user = &S,
                                            .rng = &rng},
                                &w->res[k]);
    CHECK(rc == AG_OK, "ag__exec_call: %s", ag_err_name(rc));
    json_decref(parsed);
  }
  return NULL;
}

static void flaky_on_threads(void) {
  ag_config cfg = retry_config(3, 4);
  cfg.retry.backoff = AG_BACKOFF_EXPONENTIAL;
  cfg.retry.max_delay_ms = 6;
  cfg.retry.jitter = true;
  shared_reset(2, 6); /* equal jitter: never under half the delay */
  ag__tool tool = native_tool("flaky", flaky, &S);
  worker w[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    memset(&w[i], 0, sizeof(w[i]));
    w[i].index = i;
    w[i].tool = &tool;
    w[i].cfg = &cfg;
    start(&th[i], flaky_worker, &w[i]);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < THREADS; i++) {
    for (int k = 0; k < CALLS; k++) {
      char who[48], want[48];
      int id = i * CALLS + k;
      snprintf(who, sizeof(who), "flaky call %d", id);
      snprintf(want, sizeof(want), "ok %d on attempt 3", id);
      CHECK_RESULT(w[i].res[k], AG_EXEC_OK, want, who);
      CHECK(w[i].res[k].attempts == 3, "%s: %d attempts, want 3", who,
            w[i].res[k].attempts);
      ag_exec_result_clear(&w[i].res[k]);
    }
  }
  pthread_mutex_lock(&S.mu);
  CHECK(S.events_total == 3 * MAX_IDS, "attempt events: %d, want %d",
        S.events_total, 3 * MAX_IDS);
  for (int id = 0; id < MAX_IDS; id++)
    CHECK(S.events[id] == 3 && S.tool_attempts[id] == 3,
          "call %d: %d events and %d tool runs, want 3 and 3", id, S.events[id],
          S.tool_attempts[id]);
  CHECK(S.wrong_thread == 0,
        "%d attempt event(s) arrived on another thread than the call's",
        S.wrong_thread);
  CHECK(S.bad_delay == 0, "%d retry delay(s) outside [%lld, %lld] ms",
        S.bad_delay, (long long)S.min_delay, (long long)S.max_delay);
  pthread_mutex_unlock(&S.mu);
}

/* ------------------------------------------------------------------------ */
/* 2, 3. Cancels during retry waits                                         */
/* ------------------------------------------------------------------------ */

static ag_tool_status refused(void *user, const json_t *args, ag_cancel *cancel,
                              ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  ag_output_printf(out, "Connection refused");
  return AG_TOOL_ERROR;
}

typedef struct waiter {
  int index;
  const ag__tool *tool;
  const ag_config *cfg;
  ag_cancel *turn;
  ag_exec_result res;
  long long took_ms;
} waiter;

static void *retry_waiter(void *arg) {
  waiter *w = arg;
  pthread_mutex_lock(&S.mu);
  S.caller[w->index] = pthread_self();
  pthread_mutex_unlock(&S.mu);
  uint64_t rng = 7;
  long long t0 = tsan_now_ms();
  ag_err_t rc = ag__exec_call(&(ag__call){.tool = w->tool,
                                          .cfg = w->cfg,
                                          .args = "{}",
                                          .args_len = 2,
                                          .turn = w->turn,
                                          .call_index = w->index,
                                          .on_attempt = on_attempt,
                                          .attempt_user = &S,
                                          .rng = &rng},
                              &w->res);
  w->took_ms = tsan_now_ms() - t0;
  CHECK(rc == AG_OK, "ag__exec_call: %s", ag_err_name(rc));
  return NULL;
}

/* Runs THREADS calls of the always-refused tool with a 10 s retry delay;
 * `cancel_root` (when true) cancels the root once every call reported its
 * first attempt, i.e. sits in its retry wait. */
static void cancel_during_waits(ag_cancel *root, bool cancel_root,
                                ag_exec_status want_status,
                                const char *want_text) {
  ag_config cfg = retry_config(3, 10000);
  shared_reset(10000, 10000);
  ag__tool tool = native_tool("fetch", refused, NULL);
  /* half the calls wait on the root itself, half on a turn under it */
  ag_cancel *turns[THREADS];
  waiter w[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    turns[i] = NULL;
    if (i % 2 == 1) {
      ag_err_t rc = ag_cancel_new(&turns[i], root, ag_now_ms() + 60000,
                                  AG_CANCEL_DEADLINE, NULL);
      CHECK(rc == AG_OK, "ag_cancel_new: %s", ag_err_name(rc));
    }
    memset(&w[i], 0, sizeof(w[i]));
    w[i].index = i;
    w[i].tool = &tool;
    w[i].cfg = &cfg;
    w[i].turn = turns[i] != NULL ? turns[i] : root;
    start(&th[i], retry_waiter, &w[i]);
  }
  if (cancel_root) {
    long long t0 = tsan_now_ms();
    pthread_mutex_lock(&S.mu);
    while (S.events_total < THREADS && tsan_now_ms() - t0 < 5000) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 20 * 1000000L;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&S.changed, &S.mu, &until);
    }
    int seen = S.events_total;
    pthread_mutex_unlock(&S.mu);
    CHECK(seen == THREADS, "%d of %d calls reached their retry wait in 5 s",
          seen, THREADS);
    ag_cancel_cancel(root, AG_CANCEL_USER);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < THREADS; i++) {
    char who[48];
    snprintf(who, sizeof(who), "waiting call %d", i);
    CHECK_RESULT(w[i].res, want_status, want_text, who);
    CHECK(w[i].res.attempts == 1,
          "%s: %d attempts, want 1 (cancelled in "
          "the wait after the first)",
          who, w[i].res.attempts);
    CHECK(w[i].took_ms < 5000, "%s: the 10 s wait ended after %lld ms", who,
          w[i].took_ms);
    ag_exec_result_clear(&w[i].res);
    ag_cancel_free(turns[i]);
  }
  pthread_mutex_lock(&S.mu);
  CHECK(S.events_total == THREADS, "attempt events: %d, want %d",
        S.events_total, THREADS);
  CHECK(S.wrong_thread == 0 && S.bad_delay == 0,
        "events on the wrong thread: %d, with a delay other than 10000: %d",
        S.wrong_thread, S.bad_delay);
  pthread_mutex_unlock(&S.mu);
}

static void caller_cancel_during_waits(void) {
  ag_cancel *root = NULL;
  ag_err_t rc = ag_cancel_new(&root, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL);
  CHECK(rc == AG_OK, "ag_cancel_new: %s", ag_err_name(rc));
  cancel_during_waits(root, true, AG_EXEC_CANCELLED, "Cancelled by the caller");
  ag_cancel_free(root);
}

static void deadline_during_waits(void) {
  ag_cancel *root = NULL;
  long long t0 = tsan_now_ms();
  ag_err_t rc =
      ag_cancel_new(&root, NULL, ag_now_ms() + 250, AG_CANCEL_DEADLINE, NULL);
  CHECK(rc == AG_OK, "ag_cancel_new: %s", ag_err_name(rc));
  cancel_during_waits(root, false, AG_EXEC_CANCELLED,
                      "Cancelled: turn deadline passed");
  long long took = tsan_now_ms() - t0;
  CHECK(took >= 240,
        "the calls ended %lld ms after the start, before the "
        "250 ms deadline",
        took);
  ag_cancel_free(root);
}

/* ------------------------------------------------------------------------ */
/* 4. Per-attempt timeouts on 6 threads                                     */
/* ------------------------------------------------------------------------ */

static ag_tool_status hang(void *user, const json_t *args, ag_cancel *cancel,
                           ag_output *out) {
  (void)user;
  (void)args;
  (void)out;
  ag_cancel_reason r = ag_cancel_wait(cancel, 10000);
  if (r == AG_CANCEL_TIMEOUT)
    return AG_TOOL_TIMEOUT;
  return r != AG_CANCEL_NONE ? AG_TOOL_CANCELLED : AG_TOOL_OK;
}

static void timeouts_on_threads(void) {
  ag_config cfg = retry_config(2, 1);
  shared_reset(1, 1);
  ag__tool idem = native_tool("slow", hang, NULL);
  idem.def.timeout_ms = 20;
  ag__tool once = idem;
  once.def.name = "charge";
  once.def.idempotent = false;
  waiter w[THREADS];
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    memset(&w[i], 0, sizeof(w[i]));
    w[i].index = i;
    w[i].tool = i % 2 == 0 ? &idem : &once;
    w[i].cfg = &cfg;
    start(&th[i], retry_waiter, &w[i]);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  int events = 0;
  for (int i = 0; i < THREADS; i++) {
    char who[48];
    snprintf(who, sizeof(who), "timing-out call %d", i);
    bool idempotent = i % 2 == 0;
    CHECK_RESULT(w[i].res, AG_EXEC_TIMEOUT,
                 idempotent
                     ? "Error after 3 attempts: Function timed out after 20ms"
                     : "Function timed out after 20ms",
                 who);
    CHECK(w[i].res.attempts == (idempotent ? 3 : 1), "%s: %d attempts, want %d",
          who, w[i].res.attempts, idempotent ? 3 : 1);
    CHECK(w[i].took_ms < 5000, "%s: took %lld ms", who, w[i].took_ms);
    events += w[i].res.attempts;
    ag_exec_result_clear(&w[i].res);
  }
  pthread_mutex_lock(&S.mu);
  CHECK(S.events_total == events, "attempt events: %d, want %d", S.events_total,
        events);
  CHECK(S.wrong_thread == 0, "%d event(s) on the wrong thread", S.wrong_thread);
  pthread_mutex_unlock(&S.mu);
}

/* ------------------------------------------------------------------------ */
/* 5. Subprocess tools from 4 threads                                       */
/* ------------------------------------------------------------------------ */

typedef struct sp_worker {
  int index;
  const ag__tool *cat, *fail;
  const ag_config *cfg;
} sp_worker;

static void *sp_run(void *arg) {
  sp_worker *w = arg;
  for (int k = 0; k < 3; k++) {
    char args[64], who[48];
    int len = snprintf(args, sizeof(args), "{\"thread\":%d,\"call\":%d}",
                       w->index, k);
    snprintf(who, sizeof(who), "cat on thread %d", w->index);
    ag_exec_result r;
    ag_err_t rc = ag__exec_call(&(ag__call){.tool = w->cat,
                                            .cfg = w->cfg,
                                            .args = args,
                                            .args_len = (size_t)len,
                                            .call_index = w->index},
                                &r);
    CHECK(rc == AG_OK, "ag__exec_call: %s", ag_err_name(rc));
    CHECK_RESULT(r, AG_EXEC_OK, args, who);
    ag_exec_result_clear(&r);

    snprintf(who, sizeof(who), "failing command on thread %d", w->index);
    uint64_t rng = (uint64_t)w->index + 1;
    rc = ag__exec_call(&(ag__call){.tool = w->fail,
                                   .cfg = w->cfg,
                                   .args = "{}",
                                   .args_len = 2,
                                   .call_index = w->index,
                                   .rng = &rng},
                       &r);
    CHECK(rc == AG_OK, "ag__exec_call: %s", ag_err_name(rc));
    CHECK_RESULT(r, AG_EXEC_ERROR, "Error after 2 attempts: Connection refused",
                 who);
    ag_exec_result_clear(&r);
  }
  return NULL;
}

static void subprocesses_on_threads(void) {
  ag_config cfg = retry_config(3, 1);
  char *cat_argv[] = {(char *)"cat", NULL};
  char *fail_argv[] = {(char *)"sh", (char *)"-c",
                       (char *)"echo 'Connection refused' >&2; exit 1", NULL};
  ag__tool cat, fail;
  memset(&cat, 0, sizeof(cat));
  cat.def.name = "cat";
  cat.def.idempotent = true;
  cat.def.timeout_ms = 30000;
  cat.def.max_retries = -1;
  cat.def.kill_grace_ms = 50;
  fail = cat;
  fail.def.name = "fetch";
  fail.def.max_retries = 1;
  cat.def.argv = (const char *const *)cat_argv;
  cat.argv_copy = cat_argv;
  fail.def.argv = (const char *const *)fail_argv;
  fail.argv_copy = fail_argv;
  enum { N = 4 };
  sp_worker w[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    w[i] = (sp_worker){i, &cat, &fail, &cfg};
    start(&th[i], sp_run, &w[i]);
  }
  for (int i = 0; i < N; i++)
    pthread_join(th[i], NULL);
}

int main(void) {
  long long t0 = tsan_now_ms();
  flaky_on_threads();
  caller_cancel_during_waits();
  deadline_during_waits();
  timeouts_on_threads();
  subprocesses_on_threads();
  printf("tsan_retry: ok (%lld ms)\n", tsan_now_ms() - t0);
  return 0;
}
