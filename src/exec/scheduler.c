/*
 * src/exec/scheduler.c - the two-phase scheduler: checks a batch of tool
 * calls, asks approvals one at a time, then runs the approved calls through
 * the retry executor, in parallel on a fixed pool of threads.
 *
 * What a batch goes through (ag_scheduler_run):
 *   pre-phase  every call, in order, on the caller's thread: skipped calls,
 *              unknown tools, arguments that are not JSON or break the
 *              schema get their final result here and never run.
 *   phase 1    on the caller's thread, in order: calls of tools that require
 *              approval are put to opts.approve, one question per distinct
 *              signature (ag_signature: name + canonical arguments) in the
 *              batch; the answer is reused for the duplicates. "Allow for the
 *              session" remembers the tool name until
 *              ag_scheduler_reset_approvals or ag_scheduler_free.
 *   phase 2    the approved calls run through ag__exec_call. One runnable
 *              call, loop.parallel false or loop.max_parallel 1: on the
 *              caller's thread, in order. Otherwise on the pool, and the
 *              caller sleeps until the last one is done. Each call writes
 *              only its own results[i], so the model's order holds whatever
 *              order they finish in.
 *
 * Data structures. The scheduler keeps a scratch array of per-call jobs (the
 * tool, the parsed arguments, the call's own xorshift state for retry
 * jitter, its result slot) and an array of pointers to the runnable ones,
 * both grown to the largest batch seen and reused: a batch allocates nothing
 * else of its own. The pool's whole shared state is one mutex guarding
 * {queue, q_len, q_next, q_pending, turn, shutdown, batch_rc} and two
 * condition variables: `work` (workers wait for jobs or shutdown) and
 * `done` (the caller waits for q_pending to reach 0).
 *
 * Threading model. ag_scheduler_new starts loop.max_parallel threads when
 * loop.parallel is true and max_parallel > 1 (nothing would run on them
 * otherwise). They block every asynchronous signal, so a SIGINT handler
 * that cancels the turn runs on an application thread, and a write to a
 * closed pipe in a subprocess tool returns EPIPE rather than killing the
 * process. A worker takes the next job under the mutex, runs it unlocked,
 * and takes the mutex again to count it done. The caller posts a batch by
 * setting the queue and waking min(jobs, threads) workers. The pool size
 * bounds the calls running at once, so no separate semaphore is needed.
 * One thread calls ag_scheduler_run at a time (exec.h); the approval
 * callback runs on that thread, on_attempt on whichever thread ran the
 * attempt. Shutdown sets the flag, wakes everyone and joins them.
 *
 * Rejected:
 *   - A thread per call or per batch: thread creation costs tens of
 *     microseconds, more than the whole 20 us per call dispatch budget.
 *   - A lock-free queue: the mutex is taken twice per call, for well under
 *     a microsecond each time, while a call's attempt token alone costs
 *     more (an eventfd). Simplicity wins.
 *   - Letting the caller's thread run jobs too: then max_parallel + 1
 *     calls could run at once, and callbacks would see one more thread.
 *   - One shared rng under a lock for jitter: each job has its own state,
 *     derived from opts.jitter_seed (or the clock), the batch number and the
 *     call index, so seeded runs are reproducible whatever the thread
 *     interleaving.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* What the pre-phase and phase 1 decided about a call. */
enum {
  JOB_RUN = 0, /* approved: runs in phase 2 */
  JOB_DONE     /* its result is final: never runs */
};

typedef struct job {
  const ag__tool *tool;
  const char *args; /* the JSON text; "{}" when the model sent nothing */
  size_t args_len;
  json_t *parsed; /* own reference until the batch ends */
  uint64_t rng;   /* this call's xorshift state */
  int index;      /* in the batch */
  int state;      /* JOB_* */
  ag_exec_result *res;
} job;

struct ag_scheduler {
  const ag_registry *reg; /* borrowed */
  ag_config cfg;
  ag_scheduler_opts opts;
  uint64_t seed;    /* base of every call's rng */
  uint64_t batches; /* batches run so far: varies the rng per batch */

  /* "allow for the session": tool names, own copies */
  char **session;
  size_t n_session, cap_session;

  /* per-batch scratch, reused */
  job *jobs;
  job **runnable;
  size_t cap_jobs;

  /* the pool; everything below `mu` is guarded by it */
  pthread_t *threads;
  int n_threads;
  pthread_mutex_t mu;
  pthread_cond_t work;
  pthread_cond_t done;
  job **queue;
  size_t q_len, q_next, q_pending;
  ag_cancel *turn;
  ag_err_t batch_rc;
  bool shutdown;
};

/* ------------------------------------------------------------------------ */
/* Results written by the scheduler itself                                  */
/* ------------------------------------------------------------------------ */

/* Fills a result that never ran. Returns AG_ENOMEM when the text could not
 * be allocated (the result is then complete but its text is NULL). */
static ag_err_t set_result(ag_exec_result *r, ag_exec_status status,
                           ag_category cat, const char *fmt, ...)
    AG__PRINTF(4, 5);

static ag_err_t set_result(ag_exec_result *r, ag_exec_status status,
                           ag_category cat, const char *fmt, ...) {
  memset(r, 0, sizeof(*r));
  r->status = status;
  r->ok = false;
  r->category = cat;
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0)
    n = 0;
  char *text = malloc((size_t)n + 1);
  if (text == NULL)
    return AG_ENOMEM;
  if ((size_t)n < sizeof(small)) {
    memcpy(text, small, (size_t)n + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(text, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  r->text = text;
  r->text_len = (size_t)n;
  return AG_OK;
}

/* `Error: unknown tool "x". Available tools: a, b, c` */
static ag_err_t set_unknown_tool(const ag_scheduler *s, ag_exec_result *r,
                                 const char *name) {
  size_t count = ag_registry_count(s->reg);
  size_t list_len = 0;
  for (size_t i = 0; i < count; i++)
    list_len += strlen(ag_registry_name(s->reg, i)) + 2;
  char *list = malloc(list_len + sizeof("(none)"));
  if (list == NULL) {
    memset(r, 0, sizeof(*r));
    r->status = AG_EXEC_NOT_FOUND;
    r->category = AG_CAT_NOT_FOUND;
    return AG_ENOMEM;
  }
  size_t at = 0;
  for (size_t i = 0; i < count; i++) {
    const char *t = ag_registry_name(s->reg, i);
    size_t tl = strlen(t);
    if (i > 0) {
      memcpy(list + at, ", ", 2);
      at += 2;
    }
    memcpy(list + at, t, tl);
    at += tl;
  }
  if (count == 0) {
    memcpy(list, "(none)", sizeof("(none)") - 1);
    at = sizeof("(none)") - 1;
  }
  list[at] = '\0';
  ag_err_t rc =
      set_result(r, AG_EXEC_NOT_FOUND, AG_CAT_NOT_FOUND,
                 "Error: unknown tool \"%s\". Available tools: %s", name, list);
  free(list);
  return rc;
}

/* A call that was approved but whose turn was over before it could start:
 * the retry executor's words and categories for a cancelled call. */
static ag_err_t set_cancelled(ag_exec_result *r, ag_cancel_reason why) {
  if (why == AG_CANCEL_USER)
    return set_result(r, AG_EXEC_CANCELLED, AG_CAT_UNKNOWN, "%s",
                      "Cancelled by the caller");
  return set_result(r, AG_EXEC_CANCELLED, AG_CAT_TIMEOUT, "%s",
                    "Cancelled: turn deadline passed");
}

/* ------------------------------------------------------------------------ */
/* Per-call rng                                                             */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static uint64_t call_seed(const ag_scheduler *s, size_t index) {
  uint64_t x = splitmix64(s->seed ^ splitmix64(s->batches)) ^ (uint64_t)index;
  x = splitmix64(x);
  return x != 0 ? x : 0x2545F4914F6CDD1Dull; /* xorshift must not be 0 */
}

/* ------------------------------------------------------------------------ */
/* The pool                                                                 */
/* ------------------------------------------------------------------------ */

static ag_err_t run_job(ag_scheduler *s, job *j, ag_cancel *turn) {
  ag__call call = {.tool = j->tool,
                   .cfg = &s->cfg,
                   .args = j->args,
                   .args_len = j->args_len,
                   .parsed = j->parsed,
                   .turn = turn,
                   .call_index = j->index,
                   .on_attempt = s->opts.on_attempt,
                   .attempt_user = s->opts.attempt_user,
                   .rng = &j->rng};
  return ag__exec_call(&call, j->res);
}

static void *worker_main(void *arg) {
  ag_scheduler *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->shutdown && s->q_next >= s->q_len)
      pthread_cond_wait(&s->work, &s->mu);
    if (s->q_next >= s->q_len)
      break; /* shutdown, and nothing left to run */
    job *j = s->queue[s->q_next++];
    ag_cancel *turn = s->turn;
    pthread_mutex_unlock(&s->mu);

    ag_err_t rc = run_job(s, j, turn);

    pthread_mutex_lock(&s->mu);
    if (rc != AG_OK)
      s->batch_rc = rc;
    if (--s->q_pending == 0)
      pthread_cond_signal(&s->done);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Stops and joins the first `n` threads. */
static void pool_stop(ag_scheduler *s, int n) {
  pthread_mutex_lock(&s->mu);
  s->shutdown = true;
  pthread_cond_broadcast(&s->work);
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < n; i++)
    pthread_join(s->threads[i], NULL);
}

static ag_err_t pool_start(ag_scheduler *s, int n, ag_error_t *err) {
  s->threads = calloc((size_t)n, sizeof(*s->threads));
  if (s->threads == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "scheduler: out of memory");

  /* Workers inherit this mask: every asynchronous signal blocked. */
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, SIGSEGV);
  sigdelset(&all, SIGBUS);
  sigdelset(&all, SIGFPE);
  sigdelset(&all, SIGILL);
  sigdelset(&all, SIGABRT);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = 0, started = 0;
  for (; started < n; started++) {
    rc = pthread_create(&s->threads[started], NULL, worker_main, s);
    if (rc != 0)
      break;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);

  if (rc != 0) {
    pool_stop(s, started);
    free(s->threads);
    s->threads = NULL;
    ag__set_error(err, AG_EIO, -1,
                  "scheduler: cannot start pool thread %d of %d: %s",
                  started + 1, n, strerror(rc));
    if (err != NULL)
      err->sys_errno = rc;
    return AG_EIO;
  }
  s->n_threads = n;
  return AG_OK;
}

/* Runs jobs[0..n) on the pool and waits for all of them. */
static ag_err_t pool_run(ag_scheduler *s, job **jobs, size_t n,
                         ag_cancel *turn) {
  pthread_mutex_lock(&s->mu);
  s->queue = jobs;
  s->q_len = n;
  s->q_next = 0;
  s->q_pending = n;
  s->turn = turn;
  s->batch_rc = AG_OK;
  if (n >= (size_t)s->n_threads) {
    pthread_cond_broadcast(&s->work);
  } else {
    for (size_t i = 0; i < n; i++)
      pthread_cond_signal(&s->work);
  }
  while (s->q_pending > 0)
    pthread_cond_wait(&s->done, &s->mu);
  ag_err_t rc = s->batch_rc;
  s->queue = NULL;
  s->q_len = s->q_next = 0;
  s->turn = NULL;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_scheduler_opts_init(ag_scheduler_opts *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof(*o));
  o->size = sizeof(*o);
  o->approve = NULL;
  o->approve_user = NULL;
  o->on_attempt = NULL;
  o->attempt_user = NULL;
  o->jitter_seed = 0;
}

AG_EXTERN ag_err_t ag_scheduler_new(ag_scheduler **out, const ag_registry *reg,
                                    const ag_config *cfg,
                                    const ag_scheduler_opts *opts,
                                    ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  if (out == NULL || reg == NULL || cfg == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_scheduler_new: out, reg or cfg is NULL");
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  /* this layout is the first versioned one: its size is the minimum */
  if (opts != NULL && ag__opts_read(&o, sizeof(o), opts, sizeof(o),
                                    "ag_scheduler_new: opts", err) != AG_OK)
    return AG_EINVAL;
  ag_scheduler *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "scheduler: out of memory");
  s->reg = reg;
  s->cfg = *cfg;
  if (s->cfg.loop.max_parallel < 1)
    s->cfg.loop.max_parallel = 1;
  s->opts = o;
  s->seed = s->opts.jitter_seed;
  if (s->seed == 0)
    s->seed = splitmix64((uint64_t)ag_now_ms() ^ (uint64_t)(uintptr_t)s);

  int rc = pthread_mutex_init(&s->mu, NULL);
  if (rc == 0) {
    rc = pthread_cond_init(&s->work, NULL);
    if (rc == 0) {
      rc = pthread_cond_init(&s->done, NULL);
      if (rc != 0)
        pthread_cond_destroy(&s->work);
    }
    if (rc != 0)
      pthread_mutex_destroy(&s->mu);
  }
  if (rc != 0) {
    free(s);
    ag__set_error(err, rc == ENOMEM ? AG_ENOMEM : AG_EIO, -1,
                  "scheduler: cannot create its lock: %s", strerror(rc));
    if (err != NULL)
      err->sys_errno = rc;
    return rc == ENOMEM ? AG_ENOMEM : AG_EIO;
  }

  if (s->cfg.loop.parallel && s->cfg.loop.max_parallel > 1) {
    ag_err_t e = pool_start(s, s->cfg.loop.max_parallel, err);
    if (e != AG_OK) {
      pthread_cond_destroy(&s->done);
      pthread_cond_destroy(&s->work);
      pthread_mutex_destroy(&s->mu);
      free(s);
      return e;
    }
  }
  *out = s;
  return AG_OK;
}

AG_EXTERN void ag_scheduler_reset_approvals(ag_scheduler *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->n_session; i++)
    free(s->session[i]);
  s->n_session = 0;
}

AG_EXTERN void ag_scheduler_free(ag_scheduler *s) {
  if (s == NULL)
    return;
  if (s->threads != NULL) {
    pool_stop(s, s->n_threads);
    free(s->threads);
  }
  pthread_cond_destroy(&s->done);
  pthread_cond_destroy(&s->work);
  pthread_mutex_destroy(&s->mu);
  ag_scheduler_reset_approvals(s);
  free(s->session);
  free(s->jobs);
  free(s->runnable);
  free(s);
}

static bool session_allows(const ag_scheduler *s, const char *tool) {
  for (size_t i = 0; i < s->n_session; i++)
    if (strcmp(s->session[i], tool) == 0)
      return true;
  return false;
}

static ag_err_t session_add(ag_scheduler *s, const char *tool) {
  if (session_allows(s, tool))
    return AG_OK;
  if (s->n_session == s->cap_session) {
    size_t cap = s->cap_session ? s->cap_session * 2 : 8;
    char **p = realloc(s->session, cap * sizeof(*p));
    if (p == NULL)
      return AG_ENOMEM;
    s->session = p;
    s->cap_session = cap;
  }
  char *copy = ag__strdup(tool);
  if (copy == NULL)
    return AG_ENOMEM;
  s->session[s->n_session++] = copy;
  return AG_OK;
}

static ag_err_t reserve_jobs(ag_scheduler *s, size_t n) {
  if (n <= s->cap_jobs)
    return AG_OK;
  job *j = realloc(s->jobs, n * sizeof(*j));
  if (j == NULL)
    return AG_ENOMEM;
  s->jobs = j;
  job **r = realloc(s->runnable, n * sizeof(*r));
  if (r == NULL)
    return AG_ENOMEM;
  s->runnable = r;
  s->cap_jobs = n;
  return AG_OK;
}

static bool all_space(const char *p, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r')
      return false;
  return true;
}

/* The pre-phase for one call: finds the tool, parses and validates the
 * arguments. Leaves j->state JOB_RUN, or JOB_DONE with the final result. */
static ag_err_t prepare(ag_scheduler *s, const ag_exec_call *c, job *j) {
  const char *name = c->name != NULL ? c->name : "";
  if (c->skip) {
    j->state = JOB_DONE;
    return set_result(j->res, AG_EXEC_SKIPPED, AG_CAT_UNKNOWN, "%s", "");
  }
  j->tool = ag__registry_find(s->reg, name);
  if (j->tool == NULL) {
    j->state = JOB_DONE;
    return set_unknown_tool(s, j->res, name);
  }

  if (c->args == NULL || all_space(c->args, c->args_len)) {
    j->args = "{}";
    j->args_len = 2;
    j->parsed = json_object();
    if (j->parsed == NULL) {
      j->state = JOB_DONE;
      set_result(j->res, AG_EXEC_ERROR, AG_CAT_RESOURCE, "%s",
                 "Error: out of memory");
      return AG_ENOMEM;
    }
  } else {
    j->args = c->args;
    j->args_len = c->args_len;
    json_error_t jerr;
    j->parsed = json_loadb(c->args, c->args_len, JSON_REJECT_DUPLICATES, &jerr);
    /* JSON allows integers past 64 bits (jansson does not): validate such
     * arguments with every integer read as the double it rounds to, as RFC
     * 8785 writes it; the schema's "integer" accepts integral numbers. The
     * tool still gets the text the model sent. */
    if (j->parsed == NULL &&
        json_error_code(&jerr) == json_error_numeric_overflow)
      j->parsed =
          json_loadb(c->args, c->args_len,
                     JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
    if (j->parsed == NULL && AG__JSON_NOMEM(&jerr)) {
      j->state = JOB_DONE;
      set_result(j->res, AG_EXEC_ERROR, AG_CAT_RESOURCE, "%s",
                 "Error: out of memory");
      return AG_ENOMEM;
    }
    if (j->parsed == NULL) {
      j->state = JOB_DONE;
      return set_result(j->res, AG_EXEC_INVALID, AG_CAT_VALIDATION,
                        "Error: invalid arguments for %s: %s at position %d",
                        name, jerr.text, jerr.position);
    }
  }

  ag_error_t verr;
  ag_error_clear(&verr);
  ag_err_t vrc = ag_registry_validate(s->reg, name, j->parsed, &verr);
  if (vrc == AG_OK && !json_is_object(j->parsed)) {
    vrc = AG_EINVAL;
    ag__scopy(verr.msg, sizeof(verr.msg), "expected object");
  }
  if (vrc == AG_ENOMEM) {
    j->state = JOB_DONE;
    set_result(j->res, AG_EXEC_ERROR, AG_CAT_RESOURCE, "%s",
               "Error: out of memory");
    return AG_ENOMEM;
  }
  if (vrc != AG_OK) {
    j->state = JOB_DONE;
    return set_result(j->res, AG_EXEC_INVALID, AG_CAT_VALIDATION,
                      "Error: invalid arguments for %s: %s", name, verr.msg);
  }
  j->state = JOB_RUN;
  return AG_OK;
}

/* One answer of phase 1, kept for the duplicates of the batch. */
typedef struct answer {
  uint8_t sig[AG_SIG_LEN];
  bool has_sig;
  ag_approval verdict;
  size_t job; /* the job whose question it answered */
} answer;

/* Phase 1: approvals, on the caller's thread, in the batch's order. */
static ag_err_t approve_all(ag_scheduler *s, size_t n, ag_cancel *turn) {
  answer *answers = NULL;
  size_t n_answers = 0;
  ag_err_t rc = AG_OK;
  char reason[AG_ERROR_MSG_MAX];

  for (size_t i = 0; i < n; i++) {
    job *j = &s->jobs[i];
    if (j->state != JOB_RUN || !j->tool->def.requires_approval)
      continue;
    const char *name = j->tool->def.name;
    if (s->opts.approve == NULL || session_allows(s, name))
      continue;
    ag_cancel_reason why = ag_cancel_check(turn, ag_now_ms());
    if (why != AG_CANCEL_NONE) {
      /* no more questions once the turn is over */
      j->state = JOB_DONE;
      if (set_cancelled(j->res, why) != AG_OK)
        rc = AG_ENOMEM;
      continue;
    }

    uint8_t sig[AG_SIG_LEN];
    bool has_sig = ag_signature(name, j->args, j->args_len, sig, NULL) == AG_OK;
    const answer *prev = NULL;
    for (size_t k = 0; has_sig && k < n_answers; k++) {
      if (answers[k].has_sig && memcmp(answers[k].sig, sig, AG_SIG_LEN) == 0) {
        prev = &answers[k];
        break;
      }
    }

    ag_approval verdict;
    if (prev != NULL) {
      verdict = prev->verdict;
      if (verdict == AG_APPROVE_DENY) {
        /* the same text as the call that was asked */
        const ag_exec_result *first = s->jobs[prev->job].res;
        j->state = JOB_DONE;
        if (set_result(j->res, AG_EXEC_DENIED, AG_CAT_PERMISSION, "%s",
                       first->text != NULL ? first->text : "") != AG_OK)
          rc = AG_ENOMEM;
      }
      continue;
    }

    reason[0] = '\0';
    verdict = s->opts.approve(s->opts.approve_user, name, j->args, j->args_len,
                              reason, sizeof(reason));
    reason[sizeof(reason) - 1] = '\0';
    if (verdict == AG_APPROVE_SESSION && session_add(s, name) != AG_OK)
      rc = AG_ENOMEM; /* approved now; just not remembered */
    if (verdict != AG_APPROVE_ONCE && verdict != AG_APPROVE_SESSION) {
      verdict = AG_APPROVE_DENY;
      j->state = JOB_DONE;
      if (set_result(j->res, AG_EXEC_DENIED, AG_CAT_PERMISSION,
                     "Tool call rejected: %s",
                     reason[0] != '\0' ? reason : "denied by the user") !=
          AG_OK)
        rc = AG_ENOMEM;
    }

    if (has_sig) {
      if (answers == NULL) {
        answers = malloc(n * sizeof(*answers));
        if (answers == NULL) {
          rc = AG_ENOMEM; /* no dedup: the duplicates get asked again */
          continue;
        }
      }
      answer *a = &answers[n_answers++];
      memcpy(a->sig, sig, AG_SIG_LEN);
      a->has_sig = true;
      a->verdict = verdict;
      a->job = i;
    }
  }
  free(answers);
  return rc;
}

AG_EXTERN ag_err_t ag_scheduler_run(ag_scheduler *s, const ag_exec_call *calls,
                                    size_t n, ag_cancel *turn,
                                    ag_exec_result *results, ag_error_t *err) {
  if (s == NULL || (n > 0 && (calls == NULL || results == NULL)))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_scheduler_run: s, calls or results is NULL");
  if (n == 0)
    return AG_OK;
  memset(results, 0, n * sizeof(*results));
  if (reserve_jobs(s, n) != AG_OK) {
    for (size_t i = 0; i < n; i++) {
      results[i].status = AG_EXEC_ERROR;
      results[i].category = AG_CAT_RESOURCE;
    }
    return ag__set_error(err, AG_ENOMEM, -1, "scheduler: out of memory");
  }

  ag_err_t rc = AG_OK;
  for (size_t i = 0; i < n; i++) {
    job *j = &s->jobs[i];
    memset(j, 0, sizeof(*j));
    j->index = (int)i;
    j->res = &results[i];
    if (prepare(s, &calls[i], j) != AG_OK)
      rc = AG_ENOMEM;
  }

  if (approve_all(s, n, turn) != AG_OK)
    rc = AG_ENOMEM;

  /* a turn already over starts nothing */
  ag_cancel_reason why = ag_cancel_check(turn, ag_now_ms());
  size_t n_run = 0;
  for (size_t i = 0; i < n; i++) {
    job *j = &s->jobs[i];
    if (j->state != JOB_RUN)
      continue;
    if (why != AG_CANCEL_NONE) {
      j->state = JOB_DONE;
      if (set_cancelled(j->res, why) != AG_OK)
        rc = AG_ENOMEM;
      continue;
    }
    j->rng = call_seed(s, i);
    s->runnable[n_run++] = j;
  }
  s->batches++;

  if (n_run > 1 && s->n_threads > 1) {
    if (pool_run(s, s->runnable, n_run, turn) != AG_OK)
      rc = AG_ENOMEM;
  } else {
    for (size_t k = 0; k < n_run; k++)
      if (run_job(s, s->runnable[k], turn) != AG_OK)
        rc = AG_ENOMEM;
  }

  for (size_t i = 0; i < n; i++) {
    json_decref(s->jobs[i].parsed);
    s->jobs[i].parsed = NULL;
  }
  if (rc != AG_OK)
    return ag__set_error(err, rc, -1, "scheduler: out of memory");
  return AG_OK;
}
