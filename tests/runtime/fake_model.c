/*
 * tests/runtime/fake_model.c - the fake model server of fake_model.h.
 *
 * One condition variable (on CLOCK_MONOTONIC) serves both waits: a delayed
 * reply waits on it until its deadline or fake_stop, and the test waits on
 * it for requests to arrive. MHD_stop_daemon joins the connection threads,
 * so fake_stop wakes the delayed ones first.
 */
#include "fake_model.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

fake_model F;

typedef struct upload {
  char *body;
  size_t len;
} upload;

static struct timespec deadline_in(int ms) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

/* Keeps body k; false when out of memory. Under F.mu. */
static bool keep_body(const upload *u) {
  char *b = realloc(F.bodies, F.bodies_len + u->len + 2);
  if (b == NULL)
    return false;
  F.bodies = b;
  memcpy(F.bodies + F.bodies_len, u->body != NULL ? u->body : "", u->len);
  F.bodies_len += u->len;
  F.bodies[F.bodies_len++] = '\n';
  F.bodies[F.bodies_len] = '\0';
  return true;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *data,
                               size_t *data_size, void **con_cls) {
  (void)cls;
  (void)url;
  (void)method;
  (void)version;
  upload *u = *con_cls;
  if (u == NULL) {
    *con_cls = calloc(1, sizeof(upload));
    return *con_cls != NULL ? MHD_YES : MHD_NO;
  }
  if (*data_size > 0) {
    char *b = realloc(u->body, u->len + *data_size + 1);
    if (b == NULL)
      return MHD_NO;
    u->body = b;
    memcpy(u->body + u->len, data, *data_size);
    u->len += *data_size;
    u->body[u->len] = '\0';
    *data_size = 0;
    return MHD_YES;
  }
  pthread_mutex_lock(&F.mu);
  int k = F.n_requests;
  if (k < FAKE_MAX_REQUESTS)
    F.body_start[k] = F.bodies_len;
  if (!keep_body(u)) {
    pthread_mutex_unlock(&F.mu);
    return MHD_NO;
  }
  F.n_requests++;
  if (k < FAKE_MAX_REQUESTS)
    F.body_start[k + 1] = F.bodies_len;
  int slot = k < F.n_replies ? k : F.n_replies - 1;
  const char *reply = F.replies[slot];
  if (F.if_body_has != NULL && u->body != NULL &&
      strstr(u->body, F.if_body_has) != NULL)
    reply = F.then_reply;
  pthread_cond_broadcast(&F.cv);
  if (F.delay_ms[slot] > 0 && slot == k) {
    struct timespec until = deadline_in(F.delay_ms[slot]);
    while (!F.stopping &&
           pthread_cond_timedwait(&F.cv, &F.mu, &until) != ETIMEDOUT) {
    }
  }
  pthread_mutex_unlock(&F.mu);
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(reply), (void *)reply, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", "application/json");
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  upload *u = *con_cls;
  if (u != NULL) {
    free(u->body);
    free(u);
  }
  *con_cls = NULL;
}

void fake_start(void) {
  memset(&F, 0, sizeof(F));
  pthread_mutex_init(&F.mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&F.cv, &ca);
  pthread_condattr_destroy(&ca);
  F.d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, handler, NULL, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(F.d, "the fake server did not start");
  F.port = MHD_get_daemon_info(F.d, MHD_DAEMON_INFO_BIND_PORT)->port;
}

void fake_stop(void) {
  if (F.stopping && F.d == NULL)
    return; /* stopped already (a test that takes the server down) */
  pthread_mutex_lock(&F.mu);
  F.stopping = true;
  pthread_cond_broadcast(&F.cv);
  pthread_mutex_unlock(&F.mu);
  if (F.d != NULL)
    MHD_stop_daemon(F.d);
  F.d = NULL;
  free(F.bodies);
  F.bodies = NULL;
  pthread_cond_destroy(&F.cv);
  pthread_mutex_destroy(&F.mu);
}

int fake_wait_requests(int n, int timeout_ms) {
  struct timespec until = deadline_in(timeout_ms);
  pthread_mutex_lock(&F.mu);
  while (F.n_requests < n &&
         pthread_cond_timedwait(&F.cv, &F.mu, &until) != ETIMEDOUT) {
  }
  int got = F.n_requests;
  pthread_mutex_unlock(&F.mu);
  return got;
}

char *fake_body(int k) {
  char *s = NULL;
  pthread_mutex_lock(&F.mu);
  if (k >= 0 && k < F.n_requests && k < FAKE_MAX_REQUESTS) {
    size_t len = F.body_start[k + 1] - F.body_start[k];
    s = malloc(len + 1);
    if (s != NULL) {
      memcpy(s, F.bodies + F.body_start[k], len);
      s[len] = '\0';
    }
  }
  pthread_mutex_unlock(&F.mu);
  return s;
}
