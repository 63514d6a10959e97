// libFuzzer target for the etcd v3 JSON-gateway answer decoders (src/rendezvous/etcd_response.cc):
// every answer of an etcd endpoint, or of whatever answers at its address, goes through them.
// Each input is fed to every decoder (as a unary answer body under a status chosen by its first
// byte, as a typed answer, as a watch stream line). Checked properties (a violation traps):
//  - no decoder crashes, throws, leaks or reads out of bounds (ASan/UBSan; an exception escaping
//    aborts the run);
//  - base64: decoding the encoding of the input gives the input back;
//  - a range answer that decodes re-encodes (as the gateway writes it) to an answer that decodes
//    to the same values; the same for a watch message's events;
//  - a malformed answer is an error with a message, never an empty Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "rendezvous/etcd_response.h"

namespace {

using ctrun::rdzv::EtcdKeyValue;
using Json = nlohmann::json;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

template <typename T>
void CheckError(const ctrun::StatusOr<T>& r) {
  if (!r.ok()) Check(!r.message().empty());
}

Json KvJson(const EtcdKeyValue& kv) {
  return {{"key", ctrun::rdzv::EtcdBase64(kv.key)},
          {"value", ctrun::rdzv::EtcdBase64(kv.value)},
          {"create_revision", std::to_string(kv.create_revision)},
          {"mod_revision", std::to_string(kv.mod_revision)},
          {"version", std::to_string(kv.version)},
          {"lease", std::to_string(kv.lease)}};
}

void RangeRoundTrip(std::string_view in) {
  auto r = ctrun::rdzv::DecodeEtcdRange(in);
  CheckError(r);
  if (!r.ok()) return;
  Json j = {{"header", {{"revision", std::to_string(r->revision)}}},
            {"count", std::to_string(r->count)},
            {"more", r->more},
            {"kvs", Json::array()}};
  for (const EtcdKeyValue& kv : r->kvs) j["kvs"].push_back(KvJson(kv));
  auto again = ctrun::rdzv::DecodeEtcdRange(j.dump());
  Check(again.ok());
  Check(again->revision == r->revision && again->count == r->count && again->more == r->more);
  Check(again->kvs == r->kvs);
}

void WatchRoundTrip(std::string_view in) {
  auto m = ctrun::rdzv::DecodeEtcdWatchMessage(in);
  CheckError(m);
  if (!m.ok() || m->kind != ctrun::rdzv::EtcdWatchMessage::Kind::kEvents) return;
  Json events = Json::array();
  for (const auto& e : m->events)
    events.push_back({{"type", e.type == ctrun::rdzv::EtcdEventType::kDelete ? "DELETE" : "PUT"}, {"kv", KvJson(e.kv)}});
  auto again = ctrun::rdzv::DecodeEtcdWatchMessage(
      Json{{"result", {{"header", {{"revision", std::to_string(m->revision)}}}, {"events", events}}}}.dump());
  Check(again.ok() && again->kind == m->kind && again->events.size() == m->events.size());
  for (size_t i = 0; i < m->events.size(); ++i)
    Check(again->events[i].type == m->events[i].type && again->events[i].kv == m->events[i].kv);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  auto b64 = ctrun::rdzv::EtcdUnBase64(ctrun::rdzv::EtcdBase64(in));
  Check(b64.ok() && *b64 == in);
  CheckError(ctrun::rdzv::EtcdUnBase64(in));

  static constexpr long kStatuses[] = {200, 200, 200, 400, 401, 404, 429, 500, 503, 0};
  const long status = size ? kStatuses[data[0] % (sizeof kStatuses / sizeof kStatuses[0])] : 200;
  const auto answer = ctrun::rdzv::ClassifyEtcdAnswer(status, in);
  Check(answer.verdict == ctrun::rdzv::EtcdVerdict::kOk || !answer.message.empty());
  Check(!ctrun::rdzv::EtcdErrorMessage(in).empty());

  RangeRoundTrip(in);
  WatchRoundTrip(in);
  CheckError(ctrun::rdzv::DecodeEtcdRevision(in));
  CheckError(ctrun::rdzv::DecodeEtcdDelete(in));
  CheckError(ctrun::rdzv::DecodeEtcdCreate(in, "k", "v", 1));
  CheckError(ctrun::rdzv::DecodeEtcdLeaseGrant(in));
  CheckError(ctrun::rdzv::DecodeEtcdKeepAlive(in));
  CheckError(ctrun::rdzv::DecodeEtcdAuthToken(in));
  return 0;
}
