// CurlApi: libcurl, loaded with dlopen the first time the etcd backend needs it. The agent binary
// does not link libcurl: it (and its ~30 dependent libraries: TLS, Kerberos, LDAP, ...) would cost
// every run a few ms of dynamic loading, although only etcd rendezvous uses it. A machine without
// libcurl runs every other backend; --rdzv_backend=etcd then says what is missing.
//
// Contract: LoadCurl() is idempotent and thread-safe (a function-local static); the table it
// returns stays valid until exit (the library is never unloaded). curl.h still provides the types
// and constants: its ABI (libcurl.so.4) is stable.
#pragma once

#include <curl/curl.h>

#include "base/status.h"

namespace ctrun::rdzv {

struct CurlApi {
  CURLcode (*global_init)(long flags);
  CURL* (*easy_init)();
  void (*easy_cleanup)(CURL* easy);
  CURLcode (*easy_setopt)(CURL* easy, CURLoption option, ...);
  CURLcode (*easy_getinfo)(CURL* easy, CURLINFO info, ...);
  const char* (*easy_strerror)(CURLcode code);
  CURLM* (*multi_init)();
  CURLMcode (*multi_cleanup)(CURLM* multi);
  CURLMcode (*multi_add_handle)(CURLM* multi, CURL* easy);
  CURLMcode (*multi_remove_handle)(CURLM* multi, CURL* easy);
  CURLMcode (*multi_setopt)(CURLM* multi, CURLMoption option, ...);
  CURLMcode (*multi_socket_action)(CURLM* multi, curl_socket_t fd, int ev_bitmask, int* running);
  CURLMsg* (*multi_info_read)(CURLM* multi, int* msgs_in_queue);
  curl_slist* (*slist_append)(curl_slist* list, const char* text);
  void (*slist_free_all)(curl_slist* list);
};

// Loads libcurl.so.4 and resolves every symbol, once. The error names the library and dlerror().
StatusOr<const CurlApi*> LoadCurl();

// The loaded table; only after LoadCurl() succeeded.
const CurlApi& Curl();

// Restricts `easy` to http and https with the option the loaded libcurl knows: the headers may be
// newer than the library (CURLOPT_PROTOCOLS_STR is 7.85's; Ubuntu 22.04 and RHEL 8/9 ship older
// ones, which answer CURLE_UNKNOWN_OPTION), so the older bit mask is the fallback.
CURLcode RestrictToHttp(const CurlApi& api, CURL* easy);

}  // namespace ctrun::rdzv
