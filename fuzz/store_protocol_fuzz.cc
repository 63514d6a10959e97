// libFuzzer target for the store request parser (src/store/protocol.cc).
//
// Input: byte 0 picks the chunk size for the incremental pass; the rest is one connection's
// byte stream. Checked properties (a violation traps):
//  - parsing never crashes, leaks or reads out of bounds (ASan/UBSan);
//  - every decoded request re-encodes to exactly the bytes it was decoded from;
//  - feeding the stream in small chunks yields the same requests and the same final state as
//    parsing it whole, and kNeedMore always asks for more bytes than it was given.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "store/protocol.h"

namespace {

using ctrun::store::EncodeRequest;
using ctrun::store::Limits;
using ctrun::store::Request;
using ctrun::store::RequestParser;
using Result = RequestParser::Result;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

Limits SmallLimits() {
  // Small limits so the fuzzer reaches the limit checks with short inputs.
  Limits lim;
  lim.max_key_bytes = 64;
  lim.max_value_bytes = 512;
  lim.max_keys_per_request = 16;
  lim.max_request_bytes = 2048;
  lim.max_token_bytes = 32;
  return lim;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 17;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  // Whole-buffer pass.
  RequestParser whole(SmallLimits());
  std::vector<Request> reqs;
  std::string_view rest = in;
  Result end;
  for (;;) {
    Request r;
    size_t used = 0;
    end = whole.Parse(rest, &r, &used);
    if (end != Result::kRequest) break;
    Check(used > 0 && used <= rest.size());
    std::string enc;
    Check(EncodeRequest(whole.dialect(), r, &enc));
    Check(enc == rest.substr(0, used));
    rest.remove_prefix(used);
    reqs.push_back(std::move(r));
  }
  if (end == Result::kNeedMore) Check(whole.min_bytes() > rest.size());

  // Incremental pass, `chunk` bytes at a time.
  RequestParser inc(SmallLimits());
  std::string buf;
  size_t fed = 0, next = 0;
  Result inc_end = Result::kNeedMore;
  for (;;) {
    Request r;
    size_t used = 0;
    Result res = inc.Parse(buf, &r, &used);
    if (res == Result::kRequest) {
      Check(next < reqs.size() && r == reqs[next]);
      ++next;
      buf.erase(0, used);
      continue;
    }
    if (res == Result::kError) {
      inc_end = res;
      break;
    }
    Check(inc.min_bytes() > buf.size());
    if (fed == in.size()) break;
    size_t n = std::min(chunk, in.size() - fed);
    buf.append(in.substr(fed, n));
    fed += n;
  }
  Check(next == reqs.size());
  Check(inc_end == end || (end != Result::kError && inc_end != Result::kError));
  return 0;
}
