/*
 * proxy_hardening.c - the proxy alone against hostile or broken peers: its
 * relay, request targets, credentials, cut-off streams, connection limits, the
 * held-body budget (test_proxy's cases; the fake upstream, the proxy under test
 * and the client are proxy_fixture.h's).
 */
#include "proxy_fixture.h"

/* ---- The relay (src/proxy/relay.c) alone -------------------------------- */

static const char relay_body[] = "0123456789abcdef0123456789abcdef";

static enum MHD_Result relay_up(void *cls, struct MHD_Connection *c,
                                const char *url, const char *method,
                                const char *version, const char *upload,
                                size_t *upload_size, void **con_cls) {
  (void)cls, (void)url, (void)method, (void)version, (void)upload;
  (void)upload_size, (void)con_cls;
  struct MHD_Response *r = MHD_create_response_from_buffer(
      sizeof relay_body - 1, (void *)relay_body, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

typedef struct relay_probe {
  atomic_int calls;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  CURLcode cc;
} relay_probe;

static size_t relay_write(char *p, size_t s, size_t n, void *u) {
  (void)p, (void)s, (void)n;
  relay_probe *pr = u;
  if (atomic_fetch_add(&pr->calls, 1) == 0)
    return CURL_WRITEFUNC_PAUSE; /* a slow client */
  return 0; /* then the data is refused (a content loop, a bad event) */
}

static void relay_done(ag__relay_xfer *x, CURLcode cc) {
  relay_probe *pr = x->user;
  pthread_mutex_lock(&pr->mu);
  pr->done = true;
  pr->cc = cc;
  pthread_cond_signal(&pr->cv);
  pthread_mutex_unlock(&pr->mu);
}

/* A transfer whose write callback refuses the data an unpause hands it
 * ends at once with the error (libcurl reports it from curl_easy_pause
 * and stops watching the socket: before, the relay ignored it and the
 * transfer hung until its timeout, here 8 s). */
Test(proxy, relay_failed_unpause_ends_the_transfer) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, relay_up, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag__relay *r = ag__relay_start(4, NULL);
  cr_assert_not_null(r);
  relay_probe pr;
  memset(&pr, 0, sizeof pr);
  pthread_mutex_init(&pr.mu, NULL);
  pthread_cond_init(&pr.cv, NULL);
  ag__relay_xfer x;
  memset(&x, 0, sizeof x);
  x.h = curl_easy_init();
  x.done = relay_done;
  x.user = &pr;
  curl_easy_setopt(x.h, CURLOPT_URL, url);
  curl_easy_setopt(x.h, CURLOPT_WRITEFUNCTION, relay_write);
  curl_easy_setopt(x.h, CURLOPT_WRITEDATA, &pr);
  curl_easy_setopt(x.h, CURLOPT_TIMEOUT_MS, 8000L);
  ag__relay_add(r, &x);
  int64_t t0 = ag_now_ms();
  while (atomic_load(&pr.calls) == 0 && ag_now_ms() - t0 < 10000)
    nap_ms(2);
  cr_assert_eq(atomic_load(&pr.calls), 1, "the transfer never paused");
  int64_t u0 = ag_now_ms();
  ag__relay_op op;
  memset(&op, 0, sizeof op);
  ag__relay_unpause(r, &x, &op);
  pthread_mutex_lock(&pr.mu);
  while (!pr.done)
    pthread_cond_wait(&pr.cv, &pr.mu);
  pthread_mutex_unlock(&pr.mu);
  int64_t took = ag_now_ms() - u0;
  ag__relay_stop(r);
  curl_easy_cleanup(x.h);
  MHD_stop_daemon(d);
  cr_expect_neq(pr.cc, CURLE_OK);
  cr_expect_lt(took, 3000,
               "the transfer ended %lld ms after the unpause "
               "(%s)",
               (long long)took, curl_easy_strerror(pr.cc));
  pthread_cond_destroy(&pr.cv);
  pthread_mutex_destroy(&pr.mu);
}

/* A server whose /hold requests wait for `release`; it counts the
 * connections made to it. */
static atomic_int hold_seen, hold_conns;
static atomic_bool hold_release;

static enum MHD_Result hold_up(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **state) {
  (void)cls, (void)method, (void)version, (void)upload, (void)upload_size;
  if (*state == NULL) {
    *state = c;
    return MHD_YES;
  }
  if (strcmp(url, "/hold") == 0) {
    atomic_fetch_add(&hold_seen, 1);
    int64_t t0 = ag_now_ms();
    while (!atomic_load(&hold_release) && ag_now_ms() - t0 < 20000)
      nap_ms(2);
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(2, (void *)"ok", MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static void hold_conn(void *cls, struct MHD_Connection *c, void **socket_ctx,
                      enum MHD_ConnectionNotificationCode code) {
  (void)cls, (void)c, (void)socket_ctx;
  if (code == MHD_CONNECTION_NOTIFY_STARTED)
    atomic_fetch_add(&hold_conns, 1);
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
  (void)p, (void)u;
  return s * n;
}

/* With more transfers running than idle connections are kept, a transfer
 * that ends still leaves its connection for the next request (libcurl's
 * cache counts the connections in use: a cap of max_idle closed it, and
 * every request under load connected again). */
Test(proxy, relay_keeps_a_connection_while_many_transfers_run) {
  atomic_store(&hold_seen, 0);
  atomic_store(&hold_conns, 0);
  atomic_store(&hold_release, false);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, hold_up, NULL, MHD_OPTION_NOTIFY_CONNECTION, hold_conn, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  unsigned port =
      (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
  char hold_url[64], quick_url[64];
  snprintf(hold_url, sizeof hold_url, "http://127.0.0.1:%u/hold", port);
  snprintf(quick_url, sizeof quick_url, "http://127.0.0.1:%u/quick", port);
  ag__relay *r = ag__relay_start(1, NULL); /* one idle connection kept */
  cr_assert_not_null(r);
  enum { HOLDS = 3 };
  relay_probe pr[HOLDS];
  ag__relay_xfer x[HOLDS];
  for (int i = 0; i < HOLDS; i++) {
    memset(&pr[i], 0, sizeof pr[i]);
    pthread_mutex_init(&pr[i].mu, NULL);
    pthread_cond_init(&pr[i].cv, NULL);
    memset(&x[i], 0, sizeof x[i]);
    x[i].h = curl_easy_init();
    x[i].done = relay_done;
    x[i].user = &pr[i];
    curl_easy_setopt(x[i].h, CURLOPT_URL, hold_url);
    curl_easy_setopt(x[i].h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(x[i].h, CURLOPT_TIMEOUT_MS, 30000L);
    ag__relay_add(r, &x[i]);
  }
  int64_t t0 = ag_now_ms();
  while (atomic_load(&hold_seen) < HOLDS && ag_now_ms() - t0 < 10000)
    nap_ms(2);
  cr_assert_eq(atomic_load(&hold_seen), HOLDS);
  CURLcode cc[2];
  for (int k = 0; k < 2; k++) {
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, quick_url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    cc[k] = ag__relay_run(r, h);
    curl_easy_cleanup(h);
  }
  int conns = atomic_load(&hold_conns);
  atomic_store(&hold_release, true);
  for (int i = 0; i < HOLDS; i++) {
    pthread_mutex_lock(&pr[i].mu);
    while (!pr[i].done)
      pthread_cond_wait(&pr[i].cv, &pr[i].mu);
    pthread_mutex_unlock(&pr[i].mu);
  }
  ag__relay_stop(r);
  for (int i = 0; i < HOLDS; i++) {
    curl_easy_cleanup(x[i].h);
    cr_expect_eq(pr[i].cc, CURLE_OK);
    pthread_cond_destroy(&pr[i].cv);
    pthread_mutex_destroy(&pr[i].mu);
  }
  MHD_stop_daemon(d);
  cr_expect_eq(cc[0], CURLE_OK);
  cr_expect_eq(cc[1], CURLE_OK);
  cr_expect_eq(conns, HOLDS + 1,
               "%d connections: the second quick request connected again",
               conns);
}

/* ---- Hardening (docs/security.md, "The proxy") ------------------------- */

/* A request with the raw request-target `target` (CURLOPT_REQUEST_TARGET:
 * what no URL could make curl send). */
static resp *call_target(const ag_proxy *p, const char *method,
                         const char *target, const char *body) {
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_REQUEST_TARGET, target);
  resp *r = call_on(h, p, method, "/", body, NULL);
  curl_easy_cleanup(h);
  return r;
}

Test(proxy, request_target_not_a_path_is_400_and_goes_nowhere) {
  /* an upstream without a path, the documented form for Anthropic: the
   * target used to be appended to it as a string, so "@host:port/..."
   * made the upstream the userinfo of a URL to any host */
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d", U.port);
  P = proxy_with(test_cfg(), 0, NULL);
  const char *targets[] = {
      "@127.0.0.1:%d/latest/meta-data", "//127.0.0.1:%d/latest/meta-data",
      "http://127.0.0.1:%d/v1/models", "127.0.0.1:%d", "*"};
  const char *methods[] = {"GET", "GET", "GET", "CONNECT", "OPTIONS"};
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
    char t[128];
    snprintf(t, sizeof t, targets[i], U.port);
    resp *r = call_target(P, methods[i], t, NULL);
    char code[64];
    cr_expect_eq(r->status, 400, "%s %s: %ld %s", methods[i], t, r->status,
                 r->body);
    if (r->status == 400)
      cr_expect_str_eq(err_code(r, code, sizeof code), "bad_request_target");
    free(r);
  }
  cr_expect_eq(n_upstream(), 0, "nothing reached any host");
}

Test(proxy, dot_segments_and_escapes_cannot_pass_the_guard) {
  /* each of these is routed by the upstream as /v1/chat/completions (curl
   * removes dot segments, nginx merges slashes, servers decode %63): each
   * must be decided, and stopped, as that path is */
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body =
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file");
  const char *paths[] = {"/v1/./chat/completions",  "/v1/x/../chat/completions",
                         "/v1//chat/completions",   "/v1/%63hat/completions",
                         "/v1/chat/completions/",   "/v1/chat/%2E/completions",
                         "/v1/chat/completions?x=1"};
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    resp *r = call_target(P, "POST", paths[i], body);
    cr_expect_eq(r->status, 200, "%s: %ld %s", paths[i], r->status, r->body);
    cr_expect_str_eq(r->stop, "consecutive_errors", "%s", paths[i]);
    free(r);
  }
  cr_expect_eq(n_upstream(), 0, "nothing went upstream unguarded");
  /* what cannot be normalised safely is refused */
  const char *bad[] = {"/v1/chat%2Fcompletions",  "/v1/chat%5ccompletions",
                       "/v1/chat/completions%00", "/v1/%zz",
                       "/../v1/chat/completions", "/v1/chat\\completions"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    resp *r = call_target(P, "POST", bad[i], body);
    cr_expect_eq(r->status, 400, "%s: %ld %s", bad[i], r->status, r->body);
    free(r);
  }
  cr_expect_eq(n_upstream(), 0);
  free(body);
}

Test(proxy, passed_through_paths_go_upstream_normalised) {
  canned_add(200, "{\"data\":[]}");
  resp *r = call_target(P, "GET", "/v1/x/../models/./m%2d1?q=a%20b", NULL);
  cr_expect_eq(r->status, 200, "%ld %s", r->status, r->body);
  cr_assert_eq(n_upstream(), 1);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].url, "/v1/models/m-1");
  cr_expect_str_eq(U.reqs[0].query, "a b");
  pthread_mutex_unlock(&U.mu);
  free(r);
}

/* The upstream's password planted in --upstream and in the environment,
 * looked for in everything the proxy writes. */
#define PLANTED "Planted-S3cret-9f2c1e"

Test(proxy, upstream_credentials_never_leave) {
  ag_proxy_stop(P);
  P = NULL; /* the proxy here is the program's */
  MHD_stop_daemon(U.d);
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
  int port = MHD_get_daemon_info(U.d, MHD_DAEMON_INFO_BIND_PORT)->port;
  MHD_stop_daemon(U.d); /* the port is now closed */
  U.d = NULL;
  setenv("AG_TEST_UPSTREAM_PASSWORD", PLANTED, 1);
  char ev_path[] = "/tmp/ag_proxy_events_XXXXXX";
  int efd = mkstemp(ev_path);
  cr_assert_geq(efd, 0);
  close(efd);
  char err_path[] = "/tmp/ag_proxy_stderr_XXXXXX";
  int sfd = mkstemp(err_path);
  cr_assert_geq(sfd, 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    /* the test runner's signal dispositions are not the program's */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(sfd, 2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    char up[128], bin[512];
    snprintf(up, sizeof up, "http://agent:%s@127.0.0.1:%d/v1", PLANTED, port);
    snprintf(bin, sizeof bin, "%s/agentguard", AG_BINARY_DIR);
    execl(bin, bin, "proxy", "--upstream", up, "--listen", "127.0.0.1:0",
          "--events", ev_path, (char *)NULL);
    _exit(127);
  }
  /* the port, from "listening on http://127.0.0.1:PORT" */
  unsigned pport = 0;
  for (int i = 0; i < 200 && pport == 0; i++) {
    nap_ms(25);
    char buf[1024] = {0};
    ssize_t n = pread(sfd, buf, sizeof buf - 1, 0);
    const char *at =
        n > 0 ? strstr(buf, "listening on http://127.0.0.1:") : NULL;
    if (at != NULL)
      pport = (unsigned)atoi(at + strlen("listening on http://127.0.0.1:"));
  }
  cr_assert_gt(pport, 0, "the proxy did not start");
  char bodies[3][65536];
  const char *paths[] = {"/v1/chat/completions", "/v1/models",
                         "/v1/chat/completions"};
  char *conv = conversation(0, "read", "{}", "");
  char *sconv = streaming(conversation(0, "read", "{}", ""));
  const char *posts[] = {conv, NULL, sconv};
  for (int i = 0; i < 3; i++) {
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", pport, paths[i]);
    resp r;
    memset(&r, 0, sizeof r);
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (posts[i] != NULL)
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, posts[i]);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    cr_expect_eq(curl_easy_perform(h), CURLE_OK);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    cr_expect_eq(r.status, 502, "%s: %ld %s", paths[i], r.status, r.body);
    char origin[64];
    snprintf(origin, sizeof origin, "http://127.0.0.1:%d", port);
    cr_expect(strstr(r.body, origin) != NULL, "names the upstream: %s", r.body);
    memcpy(bodies[i], r.body, sizeof bodies[i]);
    curl_easy_cleanup(h);
  }
  free(conv);
  free(sconv);
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  char all[1 << 16] = {0};
  ssize_t n = pread(sfd, all, sizeof all - 1, 0);
  close(sfd);
  cr_expect_gt(n, 0);
  FILE *f = fopen(ev_path, "r");
  cr_assert_not_null(f);
  char evs[1 << 16] = {0};
  size_t en = fread(evs, 1, sizeof evs - 1, f);
  fclose(f);
  (void)en;
  for (int i = 0; i < 3; i++) {
    cr_expect(strstr(bodies[i], PLANTED) == NULL, "body %d: %s", i, bodies[i]);
    cr_expect(strstr(bodies[i], "agent:") == NULL, "body %d: %s", i, bodies[i]);
  }
  cr_expect(strstr(all, PLANTED) == NULL, "stderr: %s", all);
  cr_expect(strstr(all, "agent:") == NULL, "stderr: %s", all);
  cr_expect(strstr(evs, PLANTED) == NULL, "events: %s", evs);
  unlink(ev_path);
  unlink(err_path);
  unsetenv("AG_TEST_UPSTREAM_PASSWORD");
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
}

Test(proxy, upstream_url_with_a_query_is_refused_without_its_password) {
  char err[4096];
  cr_expect_eq(cli("--upstream 'http://u:" PLANTED "@127.0.0.1:1/v1?x=1'", err,
                   sizeof err),
               2);
  cr_expect(strstr(err, "query") != NULL, "%s", err);
  cr_expect(strstr(err, PLANTED) == NULL, "%s", err);
  cr_expect_eq(cli("--upstream 'http://u:" PLANTED "@'", err, sizeof err), 2);
  cr_expect(strstr(err, PLANTED) == NULL, "%s", err);
}

Test(proxy, stream_cut_off_ends_with_an_error_not_done) {
  /* two text chunks, then the upstream closes: no finish_reason, no
   * [DONE] */
  const char *head = "{\"id\":\"chatcmpl-s\",\"object\":\"chat.completion."
                     "chunk\",\"created\":1,\"model\":\"m\",\"choices\":";
  char b[1024];
  snprintf(b, sizeof b,
           "data: %s[{\"index\":0,\"delta\":{\"content\":\"Hello\"},"
           "\"finish_reason\":null}]}\n\n"
           "data: %s[{\"index\":0,\"delta\":{\"content\":\" wor\"},"
           "\"finish_reason\":null}]}\n\n",
           head, head);
  canned_add(200, b);
  char *body = streaming(conversation(0, "read", "{}", ""));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "Hello") != NULL, "%s", r->body);
  cr_expect(!ends_with_done(r), "a cut stream is not made whole: %s", r->body);
  cr_expect(strstr(r->body, "\"error\"") != NULL, "%s", r->body);
  cr_expect(strstr(r->body, "cut off") != NULL, "%s", r->body);
  free(r);
  free(body);
  /* garbage instead of events: the same */
  canned_reset();
  canned_add(200, "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":"
                  "{\"content\":\"Hi\"}}]}\n\nthis is no event\n\n");
  body = streaming(conversation(0, "read", "{}", ""));
  r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect(!ends_with_done(r), "%s", r->body);
  cr_expect(strstr(r->body, "\"error\"") != NULL, "%s", r->body);
  free(r);
  free(body);
}

Test(proxy, anthropic_stream_cut_off_ends_with_an_error_event) {
  canned_add(200, "event: message_start\ndata: {\"type\":\"message_start\","
                  "\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude\",\"content\":[],"
                  "\"stop_reason\":null,\"usage\":{\"input_tokens\":1,"
                  "\"output_tokens\":1}}}\n\n"
                  "event: content_block_start\ndata: {\"type\":"
                  "\"content_block_start\",\"index\":0,\"content_block\":{"
                  "\"type\":\"text\",\"text\":\"\"}}\n\n"
                  "event: content_block_delta\ndata: {\"type\":"
                  "\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
                  "\"text_delta\",\"text\":\"Hello\"}}\n\n");
  char *body = messages_conv(0, "{}", "", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "Hello") != NULL, "%s", r->body);
  cr_expect(strstr(r->body, "event: message_stop") == NULL, "%s", r->body);
  cr_expect(strstr(r->body, "event: error") != NULL, "%s", r->body);
  free(r);
  free(body);
}

/* An upstream that takes connections and never answers; it counts the
 * connections the proxy closes (read to their end). */
typedef struct silent_up {
  int lfd;
  int port;
  atomic_int accepted, closed;
  atomic_bool quit;
  pthread_t t;
} silent_up;

static void *silent_main(void *arg) {
  silent_up *s = arg;
  struct pollfd fds[33];
  int n = 1;
  fds[0] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
  while (!atomic_load(&s->quit)) {
    if (poll(fds, (nfds_t)n, 50) <= 0)
      continue;
    for (int i = n - 1; i >= 1; i--) {
      if (fds[i].revents == 0)
        continue;
      char buf[4096];
      ssize_t r = read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) {
        close(fds[i].fd);
        fds[i] = fds[--n];
        atomic_fetch_add(&s->closed, 1);
      }
    }
    if ((fds[0].revents & POLLIN) && n < 33) {
      int c = accept(s->lfd, NULL, NULL);
      if (c >= 0) {
        fds[n++] = (struct pollfd){.fd = c, .events = POLLIN};
        atomic_fetch_add(&s->accepted, 1);
      }
    }
  }
  for (int i = 0; i < n; i++)
    close(fds[i].fd);
  return NULL;
}

static void silent_start(silent_up *s) {
  memset(s, 0, sizeof *s);
  s->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(s->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(s->lfd, 64), 0);
  socklen_t sl = sizeof sa;
  getsockname(s->lfd, (struct sockaddr *)&sa, &sl);
  s->port = ntohs(sa.sin_port);
  pthread_create(&s->t, NULL, silent_main, s);
}

/* A silent upstream, and the test's proxy in front of it with
 * --max-connections max_conns (and per_client, 0: the default). */
static void silent_proxy(silent_up *s, int max_conns, int per_client) {
  silent_start(s);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d/v1",
           s->port);
  ag_proxy_opts o = test_opts();
  o.max_connections = max_conns;
  o.max_connections_per_client = per_client;
  P = start_with(&o);
}

static void silent_stop(silent_up *s) {
  atomic_store(&s->quit, true);
  pthread_join(s->t, NULL);
}

/* A client that sends `body` and gives up after `ms`. */
static CURLcode impatient(const ag_proxy *p, const char *body, long ms) {
  CURL *h = curl_easy_init();
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(p));
  resp r;
  memset(&r, 0, sizeof r);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms);
  CURLcode cc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  return cc;
}

/* Clients that leave while the upstream has not answered: each one's
 * upstream transfer ends within about a second (libcurl's progress
 * callback watches the suspended client's socket), so its slot, worker
 * and upstream connection are free again - before, they waited for the
 * upstream or the 10-minute transfer limit, and --max-connections such
 * clients locked every later one out. Plain and streamed requests. */
Test(proxy, client_gone_while_upstream_silent_frees_everything) {
  silent_up s;
  silent_proxy(&s, 2, 0);
  char *plain = conversation(0, "read", "{}", "");
  char *streamed = streaming(conversation(0, "read", "{}", ""));
  for (int round = 0; round < 2; round++) {
    int before = atomic_load(&s.closed);
    cr_expect_eq(impatient(P, plain, 300), CURLE_OPERATION_TIMEDOUT);
    cr_expect_eq(impatient(P, streamed, 300), CURLE_OPERATION_TIMEDOUT);
    int64_t left = ag_now_ms();
    while (atomic_load(&s.closed) < before + 2 && ag_now_ms() - left < 5000)
      nap_ms(20);
    cr_expect_geq(atomic_load(&s.closed), before + 2,
                  "round %d: %d upstream transfers still open 5 s after "
                  "their clients left",
                  round, before + 2 - atomic_load(&s.closed));
  }
  cr_expect_eq(atomic_load(&s.accepted), 4);
  free(plain);
  free(streamed);
  ag_proxy_stop(P);
  P = NULL;
  silent_stop(&s);
}

typedef struct impatient_arg {
  const ag_proxy *p;
  const char *body;
  long ms;
  CURLcode cc;
} impatient_arg;

static void *impatient_main(void *arg) {
  impatient_arg *a = arg;
  a->cc = impatient(a->p, a->body, a->ms);
  return NULL;
}

/* A connection whose request is under way keeps its slot: past
 * --max-connections new ones get a 503 (and are closed); once the first
 * client leaves, the slot is free again. */
Test(proxy, connections_past_the_limit_get_503) {
  silent_up s;
  silent_proxy(&s, 1, 0);
  char *plain = conversation(0, "read", "{}", "");
  impatient_arg a = {P, plain, 1500, CURLE_OK};
  pthread_t t;
  pthread_create(&t, NULL, impatient_main, &a);
  while (atomic_load(&s.accepted) < 1)
    nap_ms(10);
  for (int i = 0; i < 4; i++) {
    resp *r = call(P, "GET", "/v1/models", NULL, NULL);
    cr_expect_eq(r->status, 503, "%s", r->body);
    cr_expect(strstr(r->body, "too_many_connections") != NULL, "%s", r->body);
    free(r);
  }
  pthread_join(t, NULL);
  cr_expect_eq(a.cc, CURLE_OPERATION_TIMEDOUT);
  /* the slot is free once the first client has left: a new request is
   * taken (it waits for the silent upstream: no 503) */
  bool taken = false;
  for (int i = 0; i < 50 && !taken; i++) {
    taken = impatient(P, plain, 200) == CURLE_OPERATION_TIMEDOUT;
    if (!taken)
      nap_ms(50);
  }
  cr_expect(taken, "no request was taken after the first client left");
  free(plain);
  ag_proxy_stop(P);
  P = NULL;
  silent_stop(&s);
}

/* A plain TCP connection to the proxy that sends `what` (may be NULL). */
static int raw_connect(const ag_proxy *p, const char *what) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons(ag_proxy_port(p)),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  if (fd >= 0 && what != NULL)
    cr_expect_eq(write(fd, what, strlen(what)), (ssize_t)strlen(what));
  return fd;
}

/* Whether the proxy has closed fd (read gives its end or a reset). */
static bool closed_by_peer(int fd) {
  char b[256];
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  if (poll(&pf, 1, 0) != 1)
    return false;
  ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Idle connections and slowloris clients (one header byte every 100 ms,
 * never done) hold every slot: a legitimate client is still served at
 * once (the one waiting longest gives way), and the slow ones are closed at
 * their deadlines (which a byte does not move). */
Test(proxy, idle_and_slowloris_connections_cannot_lock_clients_out) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.max_connections = 8;
  o.header_timeout_ms = 600;
  o.idle_timeout_ms = 600;
  P = start_with(&o);
  canned_add(200, "{\"data\":[]}");
  enum { N_IDLE = 200, N_SLOW = 8 };
  int idle[N_IDLE], slow[N_SLOW];
  for (int i = 0; i < N_IDLE; i++)
    idle[i] = raw_connect(P, NULL);
  for (int i = 0; i < N_SLOW; i++)
    slow[i] = raw_connect(P, "GET /v1/models HTTP/1.1\r\nHost: x\r\n");
  nap_ms(100);
  int64_t t0 = ag_now_ms();
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  int64_t took = ag_now_ms() - t0;
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_lt(took, 1000, "served after %lld ms", (long long)took);
  free(r);
  /* the slow ones keep sending; their deadline holds */
  int gone = 0;
  for (int k = 0; k < 40 && gone < N_SLOW; k++) {
    nap_ms(100);
    gone = 0;
    for (int i = 0; i < N_SLOW; i++) {
      if (slow[i] >= 0 && closed_by_peer(slow[i])) {
        close(slow[i]);
        slow[i] = -1;
      }
      if (slow[i] < 0)
        gone++;
      else if (send(slow[i], "X", 1, MSG_NOSIGNAL) < 0) {
        close(slow[i]);
        slow[i] = -1;
      }
    }
  }
  cr_expect_eq(gone, N_SLOW, "%d of %d slow clients still connected",
               N_SLOW - gone, N_SLOW);
  for (int i = 0; i < N_IDLE; i++)
    if (idle[i] >= 0)
      close(idle[i]);
  for (int i = 0; i < N_SLOW; i++)
    if (slow[i] >= 0)
      close(slow[i]);
}

/* The client key is checked as soon as the headers are in: a client
 * without it is answered 401 before its body is read, and closed. */
Test(proxy, client_key_is_checked_before_the_body) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 0, "k3y-for-clients");
  int fd = raw_connect(P, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          "Content-Length: 1000000\r\n\r\n{");
  char buf[512] = {0};
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 5000), 1, "no answer before the body");
  ssize_t n = read(fd, buf, sizeof buf - 1);
  cr_expect_gt(n, 12);
  cr_expect(strncmp(buf, "HTTP/1.1 401", 12) == 0, "%s", buf);
  close(fd);
  cr_expect_eq(n_upstream(), 0);
}

/* ---- The budget of bodies held whole (budget.c) ------------------------ */

#include "budget.h"

typedef struct budget_waiter {
  ag__budget *b;
  size_t n, held;
  atomic_bool got;
} budget_waiter;

static void *budget_waiter_main(void *arg) {
  budget_waiter *w = arg;
  ag__budget_wait(w->b, w->n, w->held);
  atomic_store(&w->got, true);
  return NULL;
}

Test(budget, bytes_past_the_cap_wait_for_a_release) {
  ag__budget *b = ag__budget_new(100);
  cr_assert_not_null(b);
  cr_expect(ag__budget_try(b, 80, 0));
  cr_expect(!ag__budget_try(b, 40, 0), "past the cap");
  /* B waits: A holds 80 and is not waiting, so A will give them back */
  budget_waiter w = {b, 50, 0, false};
  pthread_t t;
  pthread_create(&t, NULL, budget_waiter_main, &w);
  nap_ms(100);
  cr_expect(!atomic_load(&w.got), "took bytes that are not there");
  cr_expect(!ag__budget_try(b, 1, 0), "a newcomer overtook a waiter");
  ag__budget_release(b, 80, 0);
  pthread_join(t, NULL);
  cr_expect(atomic_load(&w.got));
  cr_expect_eq(ag__budget_used(b), 50);
  ag__budget_release(b, 50, 0);
  cr_expect_eq(ag__budget_used(b), 0);
  ag__budget_free(b);
}

Test(budget, a_lone_waiter_goes_past_the_cap) {
  /* A holds 80 and wants 40 more: no other body could give any back, so
   * waiting would be for ever; it goes past the cap */
  ag__budget *b = ag__budget_new(100);
  cr_expect(ag__budget_try(b, 80, 0));
  ag__budget_wait(b, 40, 80);
  cr_expect_eq(ag__budget_used(b), 120);
  /* while it holds them, a second waits (A is running, not waiting) */
  budget_waiter w = {b, 40, 0, false};
  pthread_t t;
  pthread_create(&t, NULL, budget_waiter_main, &w);
  nap_ms(100);
  cr_expect(!atomic_load(&w.got));
  ag__budget_release(b, 120, 0);
  pthread_join(t, NULL);
  cr_expect_eq(ag__budget_used(b), 40);
  ag__budget_release(b, 40, 0);
  ag__budget_free(b);
}

Test(budget, holders_all_waiting_let_the_oldest_through) {
  /* A and B each hold 50 (the cap) and both want more: no deadlock, the
   * one that waited first goes on, then the other once A is done */
  ag__budget *b = ag__budget_new(100);
  cr_expect(ag__budget_try(b, 50, 0));
  cr_expect(ag__budget_try(b, 50, 0));
  budget_waiter wa = {b, 50, 50, false}, wb = {b, 50, 50, false};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, budget_waiter_main, &wa);
  nap_ms(50);
  pthread_create(&tb, NULL, budget_waiter_main, &wb);
  pthread_join(ta, NULL);
  nap_ms(50);
  cr_expect(!atomic_load(&wb.got), "two past the cap at once");
  ag__budget_release(b, 100, 0); /* A is done */
  pthread_join(tb, NULL);
  cr_expect_eq(ag__budget_used(b), 100);
  ag__budget_release(b, 100, 0);
  ag__budget_free(b);
}

typedef struct big_reply_client {
  const ag_proxy *p;
  const char *body;
  long status;
  size_t len;
} big_reply_client;

static void *big_reply_main(void *arg) {
  big_reply_client *c = arg;
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(c->p));
  big_body b;
  memset(&b, 0, sizeof b);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, big_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  if (curl_easy_perform(h) == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
  c->len = b.len;
  curl_easy_cleanup(h);
  free(b.p);
  return NULL;
}

/* Guarded replies larger than the whole budget, six at once: each waits
 * its turn (or the lone one goes past the cap), none fails, none hangs. */
Test(proxy, replies_past_the_buffer_budget_wait_their_turn) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.max_buffered = 128 << 10;
  P = start_with(&o);
  size_t tl = 300 << 10;
  char *text = malloc(tl + 16);
  /* varied text: a repeated one would be the content-loop detector's */
  size_t at = 0;
  for (unsigned long k = 1; at < tl; k++)
    at += (size_t)sprintf(text + at, "%lx ", k * 2654435761ul);
  text[tl] = '\0';
  canned_call(NULL, text);
  free(text);
  char *body = conversation(0, "read", "{}", "");
  enum { N = 6 };
  big_reply_client c[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    c[i] = (big_reply_client){P, body, 0, 0};
    pthread_create(&t[i], NULL, big_reply_main, &c[i]);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    cr_expect_eq(c[i].status, 200, "client %d", i);
    cr_expect_gt(c[i].len, tl, "client %d got %zu bytes", i, c[i].len);
  }
  free(body);
}

/* A passed-through body the upstream cuts short is not made whole: the
 * client sees the transfer fail, not a complete shorter body. */
Test(proxy, passed_through_body_cut_short_stays_cut) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(lfd, 4), 0);
  socklen_t sl = sizeof sa;
  getsockname(lfd, (struct sockaddr *)&sa, &sl);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d",
           ntohs(sa.sin_port));
  P = proxy_with(test_cfg(), 0, NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) { /* the upstream: promises 100000 bytes, sends 5000 */
    int c = accept(lfd, NULL, NULL);
    char req[4096];
    if (read(c, req, sizeof req) <= 0)
      _exit(1);
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100000\r\n\r\n";
    char part[5000];
    memset(part, 'x', sizeof part);
    if (write(c, head, strlen(head)) < 0 || write(c, part, sizeof part) < 0)
      _exit(1);
    close(c);
    _exit(0);
  }
  close(lfd);
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/files/f1/content",
           (unsigned)ag_proxy_port(P));
  big_body b;
  memset(&b, 0, sizeof b);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, big_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  CURLcode cc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  int st = 0;
  waitpid(pid, &st, 0);
  cr_expect_neq(cc, CURLE_OK,
                "a cut body reached the client as whole (%zu "
                "bytes)",
                b.len);
  cr_expect_leq(b.len, 5000);
  free(b.p);
}

static size_t count_bytes(char *p, size_t s, size_t n, void *u) {
  (void)p;
  *(size_t *)u += s * n;
  return s * n;
}

static ssize_t big_gen(void *cls, uint64_t pos, char *buf, size_t max) {
  uint64_t total = *(const uint64_t *)cls;
  if (pos >= total)
    return MHD_CONTENT_READER_END_OF_STREAM;
  size_t n = total - pos < max ? (size_t)(total - pos) : max;
  memset(buf, 'z', n);
  return (ssize_t)n;
}

static enum MHD_Result big_handler(void *cls, struct MHD_Connection *c,
                                   const char *url, const char *method,
                                   const char *version, const char *upload,
                                   size_t *upload_size, void **con_cls) {
  (void)url, (void)method, (void)version, (void)upload, (void)upload_size;
  (void)con_cls;
  uint64_t *total = cls;
  struct MHD_Response *r = MHD_create_response_from_callback(
      *total, 64 * 1024, big_gen, total, NULL);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* A passed-through body is relayed, not held: one larger than the cap on
 * a held reply (32 MiB) goes through whole (it used to be a 502). */
Test(proxy, passed_through_body_is_not_held_whole) {
  static uint64_t total = (uint64_t)AG_PROXY_UPSTREAM_MAX + (8u << 20);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, big_handler, &total, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/files/f/content",
           (unsigned)ag_proxy_port(P));
  size_t got = 0;
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, count_bytes);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
  CURLcode cc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(d);
  cr_expect_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_expect_eq(status, 200);
  cr_expect_eq(got, (size_t)total);
}

/* One client address holds at most --max-connections-per-client: past it
 * a new connection gets a 503 when the address's own are all busy (an
 * idle one of its own would give way), while the proxy has slots left. */
Test(proxy, one_address_holds_at_most_its_share) {
  silent_up s;
  silent_proxy(&s, 8, 1); /* given: loopback too */
  char *plain = conversation(0, "read", "{}", "");
  impatient_arg a = {P, plain, 1500, CURLE_OK};
  pthread_t t;
  pthread_create(&t, NULL, impatient_main, &a);
  while (atomic_load(&s.accepted) < 1)
    nap_ms(10);
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 503, "%s", r->body);
  cr_expect(strstr(r->body, "--max-connections-per-client") != NULL, "%s",
            r->body);
  free(r);
  pthread_join(t, NULL);
  free(plain);
  ag_proxy_stop(P);
  P = NULL;
  silent_stop(&s);
}
