// Decoding of etcd v3 JSON-gateway answers: bytes in, typed values or an error Status out. No I/O,
// no state, no exceptions (a malformed answer from a broken or hostile endpoint must end as an
// error the client reports, never as a crash or a throw out of a loop callback).
//
// Wire rules (proto3 JSON as the gateway writes it):
//  - int64 fields are JSON strings of decimal digits (plain JSON integers are accepted too); an
//    absent or null field means 0. A string that is not a whole int64 is an error, never 0.
//  - Revisions, versions and counts are never negative; a negative one is an error.
//  - Keys and values are standard base64 (padding optional); anything else is an error.
//  - Absent strings are "", absent booleans false, absent arrays empty; a present field of the
//    wrong JSON type is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace ctrun::rdzv {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;

  bool operator==(const EtcdKeyValue&) const = default;
};

struct EtcdRangeResult {
  int64_t revision = 0;  // the store's revision when the range was read
  std::vector<EtcdKeyValue> kvs;
  int64_t count = 0;  // keys in the range (before limit)
  bool more = false;  // the limit cut the answer short
};

// CreateIfAbsent's answer: one transaction (compare create_revision(key) == 0: put, else: range).
struct EtcdCreateResult {
  int64_t revision = 0;
  bool created = false;  // this request wrote the key
  EtcdKeyValue kv;       // the key as it now is (ours when created; revisions only then = revision)
};

struct EtcdDeleteResult {
  int64_t revision = 0;
  int64_t deleted = 0;
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl = 0;  // seconds granted (etcd raises small TTLs to its minimum)
};

enum class EtcdEventType { kPut, kDelete };

struct EtcdWatchEvent {
  EtcdEventType type = EtcdEventType::kPut;
  EtcdKeyValue kv;  // for kDelete: key and mod_revision only
};

// --- base64 ---------------------------------------------------------------------------------------

std::string EtcdBase64(std::string_view bytes);  // standard alphabet, padded
StatusOr<std::string> EtcdUnBase64(std::string_view text);

// --- HTTP answers of unary calls ----------------------------------------------------------------------

// What the client does with one HTTP answer.
enum class EtcdVerdict {
  kOk,     // a 200 with a JSON object that is not an error: decode it with the functions below
  kAuth,   // the token is missing, invalid or expired: authenticate again, then retry
  kRetry,  // 5xx or 429: another endpoint (or a later try) may answer
  kFail,   // anything else: a final error
};

struct EtcdAnswer {
  EtcdVerdict verdict = EtcdVerdict::kFail;
  long status = 0;      // the HTTP status (a 200 that carries a stream error: that error's http_code)
  std::string message;  // etcd's message (all but kOk), at most a few hundred bytes
};

EtcdAnswer ClassifyEtcdAnswer(long http_status, std::string_view body);

// etcd's message in an error body ({"error": "...", "message": "...", "code": n} for unary calls,
// {"error": {"grpc_code": n, "http_code": n, "message": "..."}} inside streams), else the body's
// first 200 bytes, else "(empty answer)".
std::string EtcdErrorMessage(std::string_view body);

// Whether an answer refused the request for its token (HTTP 401 or etcd's token messages).
bool IsEtcdTokenError(long http_status, std::string_view message);

// --- typed answers (the body of a kOk answer) -------------------------------------------------------

StatusOr<EtcdRangeResult> DecodeEtcdRange(std::string_view body);
// The header's revision: /v3/kv/put, /v3/lease/revoke.
StatusOr<int64_t> DecodeEtcdRevision(std::string_view body);
StatusOr<EtcdDeleteResult> DecodeEtcdDelete(std::string_view body);
// The create-if-absent transaction for key/value/lease (see EtcdCreateResult). Not created and no
// key in the failure branch's range: an error.
StatusOr<EtcdCreateResult> DecodeEtcdCreate(std::string_view body, const std::string& key,
                                            const std::string& value, int64_t lease);
// /v3/lease/grant; an "error" string in the answer is an error.
StatusOr<EtcdLease> DecodeEtcdLeaseGrant(std::string_view body);
// /v3/lease/keepalive: the TTL the lease was reset to (0 or less: the lease is gone).
StatusOr<int64_t> DecodeEtcdKeepAlive(std::string_view body);
// /v3/auth/authenticate: the token ("" when the server sent none).
StatusOr<std::string> DecodeEtcdAuthToken(std::string_view body);

// --- the watch stream (one JSON message per line) -----------------------------------------------------

struct EtcdWatchMessage {
  enum class Kind {
    kError,     // the stream reports an error: text, token_error
    kCanceled,  // etcd canceled the watch: text (the reason), compact_revision, token_error
    kCreated,   // the watch exists from revision + 1 on
    kProgress,  // every event up to revision has been sent
    kEvents,    // events, in revision order
  };
  Kind kind = Kind::kProgress;
  std::string text;
  bool token_error = false;
  int64_t revision = 0;
  int64_t compact_revision = 0;  // > 0: the requested start revision was compacted
  std::vector<EtcdWatchEvent> events;
};

StatusOr<EtcdWatchMessage> DecodeEtcdWatchMessage(std::string_view line);

}  // namespace ctrun::rdzv
