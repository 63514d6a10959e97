#include "rendezvous/etcd_response.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <utility>

namespace ctrun::rdzv {
namespace {

using Json = nlohmann::json;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int B64Value(char ch) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
  if (ch >= '0' && ch <= '9') return ch - '0' + 52;
  if (ch == '+') return 62;
  if (ch == '/') return 63;
  return -1;
}

// Never throws: invalid UTF-8 in strings becomes U+FFFD.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string Clip(std::string_view s, size_t n = 200) {
  std::string out(s.substr(0, n));
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// Reads typed fields out of JSON objects. The first problem is kept (with the field's path) and
// every later read returns its default, so a decoder reads everything and checks ok() once.
class Reader {
 public:
  bool ok() const { return error_.empty(); }
  Status status(std::string_view what) const {
    return Status::Error("malformed etcd " + std::string(what) + " answer: " + error_);
  }

  // `j` must be an object; a null (absent) value reads as an empty object.
  const Json& Object(const Json& j, const char* key) {
    const Json& v = Field(j, key);
    if (!v.is_null() && !v.is_object()) Fail(key, "is not an object");
    return v.is_object() ? v : Null();
  }
  const Json& Array(const Json& j, const char* key) {
    const Json& v = Field(j, key);
    if (!v.is_null() && !v.is_array()) Fail(key, "is not an array");
    return v.is_array() ? v : Null();
  }
  std::string String(const Json& j, const char* key) {
    const Json& v = Field(j, key);
    if (v.is_string()) return v.get<std::string>();
    if (!v.is_null()) Fail(key, "is not a string");
    return {};
  }
  bool Bool(const Json& j, const char* key) {
    const Json& v = Field(j, key);
    if (v.is_boolean()) return v.get<bool>();
    if (!v.is_null()) Fail(key, "is not a boolean");
    return false;
  }
  int64_t Int(const Json& j, const char* key, bool non_negative = false) {
    const Json& v = Field(j, key);
    int64_t out = 0;
    std::string bad;
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > uint64_t(INT64_MAX)) bad = "is out of range";
      out = static_cast<int64_t>(v.get<uint64_t>() & uint64_t(INT64_MAX));
    } else if (v.is_number_integer()) {
      out = v.get<int64_t>();
    } else if (v.is_string()) {
      const std::string& s = v.get_ref<const std::string&>();
      const char* end = s.data() + s.size();
      auto [p, ec] = std::from_chars(s.data(), end, out);
      if (s.empty() || ec != std::errc() || p != end) bad = "is not an int64: '" + Clip(s, 40) + "'";
    } else if (!v.is_null()) {
      bad = "is not an integer";
    }
    if (bad.empty() && non_negative && out < 0) bad = "is negative";
    if (bad.empty()) return out;
    Fail(key, bad);
    return 0;
  }
  std::string Bytes(const Json& j, const char* key) {
    std::string text = String(j, key);
    auto bytes = EtcdUnBase64(text);
    if (bytes.ok()) return std::move(*bytes);
    Fail(key, bytes.message());
    return {};
  }
  EtcdKeyValue Kv(const Json& j) {
    EtcdKeyValue kv;
    if (!j.is_object()) {
      Fail("kv", "is not an object");
      return kv;
    }
    kv.key = Bytes(j, "key");
    kv.value = Bytes(j, "value");
    kv.create_revision = Int(j, "create_revision", true);
    kv.mod_revision = Int(j, "mod_revision", true);
    kv.version = Int(j, "version", true);
    kv.lease = Int(j, "lease");
    return kv;
  }
  int64_t Revision(const Json& j) { return Int(Object(j, "header"), "revision", true); }
  void Fail(const std::string& key, const std::string& why) {
    if (error_.empty()) error_ = "'" + key + "' " + why;
  }

 private:
  static const Json& Null() {
    static const Json kNull;
    return kNull;
  }
  static const Json& Field(const Json& j, const char* key) {
    if (!j.is_object()) return Null();
    auto it = j.find(key);
    return it == j.end() ? Null() : *it;
  }
  std::string error_;
};

// The body as a JSON object, or an error naming the call.
StatusOr<Json> ParseObject(std::string_view body, std::string_view what) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Error("unreadable etcd " + std::string(what) + " answer: " + Clip(body));
  return j;
}

bool Has(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

}  // namespace

std::string EtcdBase64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kB64[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

StatusOr<std::string> EtcdUnBase64(std::string_view in) {
  size_t n = in.size();
  if (n % 4 == 0 && n >= 1 && in[n - 1] == '=') --n;
  if (n % 4 == 3 && n >= 1 && in[n - 1] == '=') --n;
  if (n % 4 == 1) return Status::Error("is not base64 (length " + std::to_string(in.size()) + ")");
  if (n != in.size() && (in.size() % 4 != 0)) return Status::Error("is not base64 (padding)");
  std::string out;
  out.reserve(n / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const int v = B64Value(in[i]);
    if (v < 0) return Status::Error("is not base64 (byte " + std::to_string(i) + ")");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string EtcdErrorMessage(std::string_view body) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_object()) {
    Reader r;  // wrong types read as "": the raw body is the message then
    if (auto e = j.find("error"); e != j.end() && e->is_object()) {
      if (std::string m = r.String(*e, "message"); !m.empty()) return Clip(m, 400);
    }
    if (std::string m = r.String(j, "message"); !m.empty()) return Clip(m, 400);
    if (std::string m = r.String(j, "error"); !m.empty()) return Clip(m, 400);
  }
  std::string raw = Clip(body);
  return raw.empty() ? "(empty answer)" : raw;
}

bool IsEtcdTokenError(long status, std::string_view msg) {
  return status == 401 || Has(msg, "invalid auth token") || Has(msg, "user name is empty");
}

EtcdAnswer ClassifyEtcdAnswer(long http_status, std::string_view body) {
  EtcdAnswer a;
  a.status = http_status;
  if (http_status == 200) {
    Json j = Json::parse(body.begin(), body.end(), nullptr, false);
    if (!j.is_object()) {
      a.message = "unreadable answer: " + Clip(body);
      return a;
    }
    // Streaming calls (keepalive) answer errors with 200 and an "error" object.
    auto e = j.find("error");
    if (e == j.end() || !e->is_object()) {
      a.verdict = EtcdVerdict::kOk;
      return a;
    }
    Reader r;
    a.message = Clip(r.String(*e, "message"), 400);
    a.status = static_cast<long>(r.Int(*e, "http_code"));
    if (!r.ok() || a.message.empty()) a.message = "stream error: " + Clip(Dump(*e));
  } else {
    a.message = EtcdErrorMessage(body);
  }
  if (IsEtcdTokenError(a.status, a.message)) {
    a.verdict = EtcdVerdict::kAuth;
  } else if (a.status >= 500 || a.status == 429) {
    a.verdict = EtcdVerdict::kRetry;
  } else {
    a.verdict = EtcdVerdict::kFail;
  }
  return a;
}

StatusOr<EtcdRangeResult> DecodeEtcdRange(std::string_view body) {
  auto j = ParseObject(body, "range");
  if (!j.ok()) return j.status();
  Reader r;
  EtcdRangeResult out;
  out.revision = r.Revision(*j);
  for (const Json& kv : r.Array(*j, "kvs")) {
    out.kvs.push_back(r.Kv(kv));
    if (!r.ok()) break;
  }
  out.count = r.Int(*j, "count", true);
  out.more = r.Bool(*j, "more");
  if (!r.ok()) return r.status("range");
  return out;
}

StatusOr<int64_t> DecodeEtcdRevision(std::string_view body) {
  auto j = ParseObject(body, "revision");
  if (!j.ok()) return j.status();
  Reader r;
  const int64_t rev = r.Revision(*j);
  if (!r.ok()) return r.status("revision");
  return rev;
}

StatusOr<EtcdDeleteResult> DecodeEtcdDelete(std::string_view body) {
  auto j = ParseObject(body, "delete");
  if (!j.ok()) return j.status();
  Reader r;
  EtcdDeleteResult out{r.Revision(*j), r.Int(*j, "deleted", true)};
  if (!r.ok()) return r.status("delete");
  return out;
}

StatusOr<EtcdCreateResult> DecodeEtcdCreate(std::string_view body, const std::string& key,
                                            const std::string& value, int64_t lease) {
  auto j = ParseObject(body, "txn");
  if (!j.ok()) return j.status();
  Reader r;
  EtcdCreateResult out;
  out.revision = r.Revision(*j);
  out.created = r.Bool(*j, "succeeded");
  const Json& responses = r.Array(*j, "responses");
  if (!r.ok()) return r.status("txn");
  if (out.created) {
    out.kv = EtcdKeyValue{key, value, out.revision, out.revision, 1, lease};
    return out;
  }
  const Json& kvs = responses.empty() ? responses : r.Array(r.Object(responses[0], "response_range"), "kvs");
  if (!r.ok()) return r.status("txn");
  if (kvs.empty()) return Status::Error("etcd txn on " + key + ": neither created nor found");
  out.kv = r.Kv(kvs[0]);
  if (!r.ok()) return r.status("txn");
  return out;
}

StatusOr<EtcdLease> DecodeEtcdLeaseGrant(std::string_view body) {
  auto j = ParseObject(body, "lease grant");
  if (!j.ok()) return j.status();
  Reader r;
  if (std::string err = r.String(*j, "error"); !err.empty()) return Status::Error("etcd lease grant: " + Clip(err, 400));
  EtcdLease out{r.Int(*j, "ID"), r.Int(*j, "TTL")};
  if (!r.ok()) return r.status("lease grant");
  return out;
}

StatusOr<int64_t> DecodeEtcdKeepAlive(std::string_view body) {
  auto j = ParseObject(body, "lease keepalive");
  if (!j.ok()) return j.status();
  Reader r;
  const int64_t ttl = r.Int(r.Object(*j, "result"), "TTL");
  if (!r.ok()) return r.status("lease keepalive");
  return ttl;
}

StatusOr<std::string> DecodeEtcdAuthToken(std::string_view body) {
  auto j = ParseObject(body, "authenticate");
  if (!j.ok()) return j.status();
  Reader r;
  std::string token = r.String(*j, "token");
  if (!r.ok()) return r.status("authenticate");
  return token;
}

StatusOr<EtcdWatchMessage> DecodeEtcdWatchMessage(std::string_view line) {
  auto j = ParseObject(line, "watch");
  if (!j.ok()) return j.status();
  Reader r;
  EtcdWatchMessage m;
  if (auto e = j->find("error"); e != j->end() && !e->is_null()) {
    m.kind = EtcdWatchMessage::Kind::kError;
    m.text = e->is_object() ? Clip(r.String(*e, "message"), 400) : Clip(Dump(*e));
    const int64_t code = e->is_object() ? r.Int(*e, "http_code") : 0;
    if (!r.ok()) m.text = Clip(Dump(*e));  // still an error message: the stream is retried anyway
    m.token_error = IsEtcdTokenError(static_cast<long>(code), m.text);
    return m;
  }
  const Json& res = r.Object(*j, "result");
  m.revision = r.Revision(res);
  if (r.Bool(res, "canceled")) {
    m.kind = EtcdWatchMessage::Kind::kCanceled;
    m.text = Clip(r.String(res, "cancel_reason"), 400);
    m.compact_revision = r.Int(res, "compact_revision", true);
    m.token_error = IsEtcdTokenError(0, m.text);
  } else if (r.Bool(res, "created")) {
    m.kind = EtcdWatchMessage::Kind::kCreated;
  } else {
    const Json& events = r.Array(res, "events");
    m.kind = events.empty() ? EtcdWatchMessage::Kind::kProgress : EtcdWatchMessage::Kind::kEvents;
    for (const Json& ev : events) {
      EtcdWatchEvent e;
      const std::string type = r.String(ev, "type");
      if (type == "DELETE") {
        e.type = EtcdEventType::kDelete;
      } else if (!type.empty() && type != "PUT") {
        r.Fail("type", "is not PUT or DELETE: '" + Clip(type, 40) + "'");
      }
      e.kv = r.Kv(r.Object(ev, "kv"));
      if (!r.ok()) break;
      m.events.push_back(std::move(e));
    }
  }
  if (!r.ok()) return r.status("watch");
  return m;
}

}  // namespace ctrun::rdzv
