/*
 * src/base/curl.c - libcurl's global initialisation, made once for the
 * whole library: the HTTP providers, the proxy and the trace exporter all
 * call ag__curl_init before their first handle. libcurl's own implicit
 * initialisation (on a first curl_easy_init) is not thread-safe; this one
 * is (pthread_once). Never cleaned up: curl_global_cleanup is not safe
 * while another part of the program may use libcurl, and the process's
 * exit reclaims it.
 */
#include <curl/curl.h>
#include <pthread.h>

#include "internal.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static CURLcode init_rc = CURLE_OK;

static void init(void) {
  init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int ag__curl_init(void) {
  pthread_once(&once, init);
  return (int)init_rc;
}
