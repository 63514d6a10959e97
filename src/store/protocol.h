// c10d TCPStore wire protocol, both dialects, as pure functions: no sockets, no logging, no clock.
// Built on its own (clang + libFuzzer, fuzz/store_protocol_fuzz.cc), so it depends only on the
// standard library.
//
// Contract:
//  - Integers are host byte order (little-endian on every platform ctrun targets); strings and
//    byte vectors are `uint64 length + bytes`; key counts are uint64. No framing, no request ids.
//  - RequestParser decodes one connection's byte stream incrementally. The caller appends what it
//    reads to a buffer and calls Parse() on the unconsumed front; Parse() never keeps pointers into
//    that buffer. A request is returned only when complete, so a truncated request is simply
//    kNeedMore forever (the server's connection close cleans it up). Until it is complete, Parse
//    only walks its length fields (no copy, no allocation) and remembers how far it got, so the
//    next call must see the same front with more bytes after it (a shorter input restarts the
//    walk); the fields are copied once, when it is all there. A request that arrives in many
//    pieces thus costs O(its size) in all, not O(size x pieces).
//  - Dialect is chosen from the first bytes of a connection and fixed afterwards:
//      `00 CE F7 85 3C`  -> kModern (torch >= 2.1: VALIDATE + magic must come first)
//      first byte 0..12  -> kLegacy (torch <= 2.0; 0 followed by anything but the magic is a SET)
//      kAuthByte + magic -> ctrun AUTH (optional shared token), then detection starts over
//    A legacy SET whose key length has the magic as its low 32 bits would be a >= 1 GiB key, which
//    the key limit refuses anyway, so the two cannot be confused.
//  - Bounded: every declared length/count is checked against Limits *before* anything is
//    allocated or awaited; a violation is kError (the server closes the connection). Parse never
//    allocates more than the bytes it has actually been given.
//  - Not thread-safe; one parser per connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ctrun::store {

enum class Dialect : uint8_t {
  kUnknown = 0,  // nothing decided yet (start of a connection, or only AUTH seen)
  kLegacy,       // torch <= 2.0 (1.13 has codes 0..8; 2.0 adds 9..12)
  kModern,       // torch >= 2.1 (VALIDATE handshake, codes 0..16)
};
const char* DialectName(Dialect d);

// Dialect-independent operation. The wire code depends on the dialect (WireCode / OpFromWire).
enum class Op : uint8_t {
  kValidate,    // modern only, first message: uint32 magic -> (no reply)
  kSet,         // key, value -> (no reply)
  kCompareSet,  // key, expected, desired -> value
  kGet,         // key -> value (missing key: the server closes the connection)
  kAdd,         // key, int64 -> int64
  kCheck,       // n, keys -> uint8 CheckResponse
  kWait,        // n, keys -> uint8 STOP_WAITING when all exist
  kNumKeys,     // -> int64
  kWatchKey,    // legacy only: key -> uint8 KEY_CALLBACK_REGISTERED
  kDeleteKey,   // key -> int64 number deleted
  kAppend,      // key, value -> (no reply)
  kMultiGet,    // n, keys -> n values
  kMultiSet,    // n, (key, value) x n -> (no reply)
  kCancelWait,  // -> uint8 WAIT_CANCELED
  kPing,        // modern only: uint32 nonce -> the same uint32
  kQueuePush,   // modern only: key, value -> (no reply)
  kQueuePop,    // modern only: key -> int64 queue length before the pop [, value if it was > 0]
  kQueueLen,    // modern only: key -> int64
  kAuth,        // ctrun only, first message: token -> uint8 kAuthOk (or close)
};
const char* OpName(Op op);

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// ctrun AUTH request: kAuthByte, uint32 kAuthMagic, uint64 token length, token bytes.
// 0xF5 is no query type in either dialect; the magic is the ASCII bytes "CTRA".
inline constexpr uint8_t kAuthByte = 0xF5;
inline constexpr uint32_t kAuthMagic = 0x41525443;
inline constexpr uint8_t kAuthOk = 0x00;

// Reply bytes.
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;
inline constexpr uint8_t kKeyCallbackRegistered = 3;  // legacy WatchResponseType

// Wire code of op in dialect d; -1 if the dialect has no such query (or d is kUnknown).
int WireCode(Dialect d, Op op);
// Op for a wire code; false if unknown in that dialect.
bool OpFromWire(Dialect d, uint8_t code, Op* op);

struct Limits {
  size_t max_key_bytes = 1u << 20;             // one key (torch's own keys are < 200 bytes)
  size_t max_value_bytes = 256u << 20;         // one value
  size_t max_keys_per_request = 128u * 1024;   // CHECK/WAIT/MULTI_GET/MULTI_SET count
  size_t max_request_bytes = (256u << 20) + (16u << 20);  // a whole request, all fields together
  size_t max_token_bytes = 4096;
};

// One decoded request. Field use per op:
//   keys:   every key, in wire order (SET/GET/...: keys[0]; CHECK/WAIT/MULTI_*: all)
//   values: SET/APPEND/QUEUE_PUSH: values[0]; COMPARE_SET: values[0]=expected, values[1]=desired;
//           MULTI_SET: values[i] belongs to keys[i]; AUTH: values[0] = token
//   delta:  ADD;  u32: VALIDATE magic, PING nonce
struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t delta = 0;
  uint32_t u32 = 0;

  bool operator==(const Request&) const = default;
};

class RequestParser {
 public:
  enum class Result { kRequest, kNeedMore, kError };

  explicit RequestParser(Limits limits = {}) : limits_(limits) {}

  // Decodes the request at the front of `in`. kRequest: *out is filled and *consumed is its size.
  // kNeedMore: `in` holds an incomplete request; call again once more bytes arrived (min_bytes()
  // says how many `in` must hold before anything can change). kError: see error(); the parser stays
  // in the error state.
  Result Parse(std::string_view in, Request* out, size_t* consumed);

  Dialect dialect() const { return dialect_; }
  // Number of complete requests decoded so far (AUTH and VALIDATE included).
  uint64_t requests() const { return requests_; }
  size_t min_bytes() const { return min_bytes_; }
  const std::string& error() const { return error_; }

 private:
  Result Fail(std::string why);

  Limits limits_;
  // How far the walk of the incomplete request at the front has got, for CHECK/WAIT/MULTI_*
  // (whose item count is unbounded): `pos` is just past item `next` - 1 of `count` (0: no walk).
  struct Walk {
    size_t pos = 0;
    Op op = Op::kSet;
    uint64_t count = 0;
    uint64_t next = 0;
  };
  Walk walk_;
  Dialect dialect_ = Dialect::kUnknown;
  bool auth_allowed_ = true;  // only as the very first message
  uint64_t requests_ = 0;
  size_t min_bytes_ = 1;
  std::string error_;
};

// --- Encoders -------------------------------------------------------------------------------------
// Request bytes for `req` in dialect d (kAuth/kValidate are dialect-free). Returns false (and leaves
// *out untouched) when the dialect lacks the op. Used by the client and the tests.
bool EncodeRequest(Dialect d, const Request& req, std::string* out);

// Reply pieces (append to *out).
void AppendU8(std::string* out, uint8_t v);
void AppendU32(std::string* out, uint32_t v);
void AppendI64(std::string* out, int64_t v);
void AppendU64(std::string* out, uint64_t v);
void AppendBytes(std::string* out, std::string_view bytes);  // uint64 length + bytes

// Readers used by the client for replies: false when `in` is too short (nothing consumed).
bool ReadU8(std::string_view* in, uint8_t* v);
bool ReadU32(std::string_view* in, uint32_t* v);
bool ReadI64(std::string_view* in, int64_t* v);
bool ReadU64(std::string_view* in, uint64_t* v);

}  // namespace ctrun::store
