/*
 * tests/tsan/tsan_http.c - the HTTP provider cancelled from other threads,
 * as a plain program for ThreadSanitizer (tests/runtime/test_http_provider.c
 * holds the protocol tests, against a fake server).
 *
 * The "server" is a listening socket that never accepts: the kernel
 * completes the connection and takes the request, and no answer ever comes.
 * Four providers run requests on four threads; a fifth thread cancels their
 * tokens one by one. Each request must end AG_ECANCELLED within 500 ms of
 * its cancel (the provider waits on the token's eventfd). Then one request
 * whose turn token's deadline passes, with a parent token cancelled by
 * another thread meanwhile never firing first.
 * Exits 0 when every check holds; the first failed check exits 1.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "agentguard.h"
#include "tsan_common.h"

#define N 4

static int listen_port(int *fd_out) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0, "socket");
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "bind");
  CHECK(listen(fd, 16) == 0, "listen");
  socklen_t len = sizeof(a);
  CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0, "getsockname");
  *fd_out = fd;
  return ntohs(a.sin_port);
}

typedef struct job {
  ag_provider *p;
  ag_cancel *c;
  ag_err_t rc;
  atomic_llong cancelled_at;
  long long returned_at;
} job;

static json_t *msgs;

static void *run(void *arg) {
  job *j = arg;
  ag_request req = {msgs, NULL, 1, 1, NULL, 0};
  ag_reply r;
  ag_provider_error pe;
  j->rc = ag_provider_complete(j->p, &req, j->c, NULL, NULL, &r, &pe);
  j->returned_at = tsan_now_ms();
  return NULL;
}

int main(void) {
  int lfd;
  int port = listen_port(&lfd);
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", port);
  setenv("NO_PROXY", "127.0.0.1", 1);
  setenv("no_proxy", "127.0.0.1", 1);
  msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "hi");
  CHECK(msgs != NULL, "json_pack");

  ag_http_provider_opts o;
  ag_http_provider_opts_init(&o);
  o.base_url = url;
  o.model = "m";
  o.api_key_env = "";
  job jobs[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    memset(&jobs[i], 0, sizeof(jobs[i]));
    o.stream = i % 2 == 0;
    ag_error_t err;
    CHECK(ag_provider_http_new(&jobs[i].p, &o, &err) == AG_OK, "%s", err.msg);
    CHECK(ag_cancel_new(&jobs[i].c, NULL, INT64_MAX, AG_CANCEL_DEADLINE,
                        NULL) == AG_OK,
          "ag_cancel_new");
    CHECK(pthread_create(&th[i], NULL, run, &jobs[i]) == 0, "pthread_create");
  }
  tsan_sleep_ms(150);
  for (int i = 0; i < N; i++) {
    atomic_store(&jobs[i].cancelled_at, tsan_now_ms());
    ag_cancel_cancel(jobs[i].c, AG_CANCEL_USER);
    tsan_sleep_ms(20);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    long long took = jobs[i].returned_at - atomic_load(&jobs[i].cancelled_at);
    CHECK(jobs[i].rc == AG_ECANCELLED, "request %d: %s", i,
          ag_err_name(jobs[i].rc));
    CHECK(took < 500, "request %d ended %lld ms after its cancel", i, took);
    ag_cancel_free(jobs[i].c);
  }

  /* A turn deadline under a parent another thread may cancel later. */
  ag_cancel *parent, *turn;
  CHECK(ag_cancel_new(&parent, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL) ==
            AG_OK,
        "parent");
  CHECK(ag_cancel_new(&turn, parent, ag_now_ms() + 200, AG_CANCEL_DEADLINE,
                      NULL) == AG_OK,
        "turn");
  jobs[0].c = turn;
  long long t0 = tsan_now_ms();
  CHECK(pthread_create(&th[0], NULL, run, &jobs[0]) == 0, "pthread_create");
  pthread_join(th[0], NULL);
  ag_cancel_cancel(parent, AG_CANCEL_USER);
  CHECK(jobs[0].rc == AG_ECANCELLED, "deadline: %s", ag_err_name(jobs[0].rc));
  CHECK(ag_cancel_check(turn, ag_now_ms()) == AG_CANCEL_DEADLINE,
        "the deadline fired first");
  CHECK(jobs[0].returned_at - t0 < 1000, "deadline took %lld ms",
        jobs[0].returned_at - t0);
  ag_cancel_free(turn);
  ag_cancel_free(parent);

  for (int i = 0; i < N; i++)
    ag_provider_free(jobs[i].p);
  json_decref(msgs);
  close(lfd);
  printf("tsan_http: ok\n");
  return 0;
}
