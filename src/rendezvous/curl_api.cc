#include "rendezvous/curl_api.h"

#include <dlfcn.h>

#include <string>

namespace ctrun::rdzv {
namespace {

constexpr const char* kLibrary = "libcurl.so.4";

template <typename F>
bool Resolve(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  if (!*out && missing->empty()) *missing = name;
  return *out != nullptr;
}

StatusOr<CurlApi> Open() {
  void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    return Status::Error(std::string("the etcd rendezvous needs libcurl (Debian package libcurl4): cannot load ") +
                         kLibrary + ": " + (why ? why : "unknown error"));
  }
  CurlApi a{};
  std::string missing;
  Resolve(lib, "curl_global_init", &a.global_init, &missing);
  Resolve(lib, "curl_easy_init", &a.easy_init, &missing);
  Resolve(lib, "curl_easy_cleanup", &a.easy_cleanup, &missing);
  Resolve(lib, "curl_easy_setopt", &a.easy_setopt, &missing);
  Resolve(lib, "curl_easy_getinfo", &a.easy_getinfo, &missing);
  Resolve(lib, "curl_easy_strerror", &a.easy_strerror, &missing);
  Resolve(lib, "curl_multi_init", &a.multi_init, &missing);
  Resolve(lib, "curl_multi_cleanup", &a.multi_cleanup, &missing);
  Resolve(lib, "curl_multi_add_handle", &a.multi_add_handle, &missing);
  Resolve(lib, "curl_multi_remove_handle", &a.multi_remove_handle, &missing);
  Resolve(lib, "curl_multi_setopt", &a.multi_setopt, &missing);
  Resolve(lib, "curl_multi_socket_action", &a.multi_socket_action, &missing);
  Resolve(lib, "curl_multi_info_read", &a.multi_info_read, &missing);
  Resolve(lib, "curl_slist_append", &a.slist_append, &missing);
  Resolve(lib, "curl_slist_free_all", &a.slist_free_all, &missing);
  if (!missing.empty()) return Status::Error(std::string(kLibrary) + " lacks " + missing + " (libcurl too old?)");
  if (CURLcode rc = a.global_init(CURL_GLOBAL_DEFAULT); rc != CURLE_OK)
    return Status::Error(std::string("curl_global_init: ") + a.easy_strerror(rc));
  return a;
}

}  // namespace

StatusOr<const CurlApi*> LoadCurl() {
  static const StatusOr<CurlApi> api = Open();
  if (!api.ok()) return api.status();
  return &api.value();
}

const CurlApi& Curl() { return **LoadCurl(); }

CURLcode RestrictToHttp(const CurlApi& api, CURL* easy) {
#if LIBCURL_VERSION_NUM >= 0x075500
  const CURLcode rc = api.easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (rc != CURLE_UNKNOWN_OPTION) return rc;
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return api.easy_setopt(easy, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#pragma GCC diagnostic pop
}

}  // namespace ctrun::rdzv
