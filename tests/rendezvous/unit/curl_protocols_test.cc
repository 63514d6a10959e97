// RestrictToHttp against stand-ins for libcurl's curl_easy_setopt: the option the loaded library
// knows is used, whatever the headers the binary was built with.
#include <gtest/gtest.h>

#include <cstdarg>
#include <vector>

#include "rendezvous/curl_api.h"

namespace ctrun::rdzv {
namespace {

std::vector<CURLoption> g_options;  // the options set, in order
std::vector<long> g_masks;          // the values given to CURLOPT_PROTOCOLS

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void Record(CURLoption option, va_list args) {
  g_options.push_back(option);
  if (option == CURLOPT_PROTOCOLS) g_masks.push_back(va_arg(args, long));
}
#pragma GCC diagnostic pop

// A libcurl older than 7.85: CURLOPT_PROTOCOLS_STR is unknown to it.
CURLcode OldSetopt(CURL*, CURLoption option, ...) {
  va_list args;
  va_start(args, option);
  Record(option, args);
  va_end(args);
  return option == CURLOPT_PROTOCOLS_STR ? CURLE_UNKNOWN_OPTION : CURLE_OK;
}

CURLcode NewSetopt(CURL*, CURLoption option, ...) {
  va_list args;
  va_start(args, option);
  Record(option, args);
  va_end(args);
  return CURLE_OK;
}

TEST(CurlProtocols, AnOlderLibcurlGetsTheBitMask) {
  g_options.clear();
  g_masks.clear();
  CurlApi api{};
  api.easy_setopt = &OldSetopt;
  EXPECT_EQ(RestrictToHttp(api, nullptr), CURLE_OK);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(g_options, (std::vector<CURLoption>{CURLOPT_PROTOCOLS_STR, CURLOPT_PROTOCOLS}));
#pragma GCC diagnostic pop
  EXPECT_EQ(g_masks, std::vector<long>{CURLPROTO_HTTP | CURLPROTO_HTTPS});
}

TEST(CurlProtocols, ACurrentLibcurlGetsTheStringOnly) {
  g_options.clear();
  CurlApi api{};
  api.easy_setopt = &NewSetopt;
  EXPECT_EQ(RestrictToHttp(api, nullptr), CURLE_OK);
  EXPECT_EQ(g_options, std::vector<CURLoption>{CURLOPT_PROTOCOLS_STR});
}

}  // namespace
}  // namespace ctrun::rdzv
