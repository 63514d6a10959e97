#include "store/protocol.h"

#include <array>
#include <cstring>

namespace ctrun::store {
namespace {

constexpr int kNone = -1;
constexpr size_t kNumOps = static_cast<size_t>(Op::kAuth) + 1;

// Wire codes per dialect, indexed by Op. Legacy = torch 1.13 (0..8) + torch 2.0 (9..12);
// modern = torch >= 2.1 (VALIDATE shifts everything by one and WATCH_KEY is gone).
constexpr std::array<int, kNumOps> kLegacyCodes = {
    kNone, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, kNone, kNone, kNone, kNone, kNone};
constexpr std::array<int, kNumOps> kModernCodes = {
    0, 1, 2, 3, 4, 5, 6, 7, kNone, 8, 9, 10, 11, 12, 13, 14, 15, 16, kNone};
constexpr uint8_t kLastLegacyCode = 12;

const std::array<int, kNumOps>* CodesOf(Dialect d) {
  switch (d) {
    case Dialect::kLegacy: return &kLegacyCodes;
    case Dialect::kModern: return &kModernCodes;
    case Dialect::kUnknown: break;
  }
  return nullptr;
}

template <typename T>
void AppendRaw(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

template <typename T>
bool ReadRaw(std::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}

// Reads fields from the front of one request. `need` records how many bytes the input must hold
// for the read that came up short, which becomes RequestParser::min_bytes().
class Cursor {
 public:
  enum class R { kOk, kShort, kTooBig };
  Cursor(std::string_view in, size_t pos, const Limits& limits)
      : in_(in), pos_(pos), limits_(limits) {}

  size_t pos() const { return pos_; }
  size_t need() const { return need_; }

  template <typename T>
  R Value(T* v) {
    if (!Have(sizeof(T))) return R::kShort;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return R::kOk;
  }
  // uint64 length + bytes, length checked against `limit` and the whole-request limit first.
  // s == nullptr: the bytes are only skipped (checked present, not copied).
  R Bytes(size_t limit, std::string* s) {
    uint64_t len = 0;
    if (R r = Value(&len); r != R::kOk) return r;
    if (len > limit || pos_ > limits_.max_request_bytes ||
        len > limits_.max_request_bytes - pos_) {
      return R::kTooBig;
    }
    if (!Have(static_cast<size_t>(len))) return R::kShort;
    if (s) s->assign(in_.data() + pos_, static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return R::kOk;
  }
  R Count(uint64_t* n) {
    if (R r = Value(n); r != R::kOk) return r;
    return *n > limits_.max_keys_per_request ? R::kTooBig : R::kOk;
  }

 private:
  bool Have(size_t n) {
    if (in_.size() - pos_ >= n) return true;
    need_ = pos_ + n;
    return false;
  }
  std::string_view in_;
  size_t pos_;
  size_t need_ = 0;
  const Limits& limits_;
};

using R = Cursor::R;

// Decodes the body (everything after the type byte) of `op` into *req. req == nullptr: only
// walks it, checking every length against the limits and copying nothing, so that a request that
// is not all there yet costs no allocation (Parse then decodes it once, when it is complete).
R DecodeBody(Op op, const Limits& lim, Cursor* c, Request* req) {
  R r = R::kOk;
  Request scratch;  // the fixed-size fields when only walking; its vectors stay empty
  Request& q = req ? *req : scratch;
  auto bytes = [&](size_t limit, std::vector<std::string>* into) {
    if (!req) return c->Bytes(limit, nullptr);
    into->emplace_back();
    return c->Bytes(limit, &into->back());
  };
  auto key = [&]() { return bytes(lim.max_key_bytes, &q.keys); };
  auto value = [&]() { return bytes(lim.max_value_bytes, &q.values); };
  switch (op) {
    case Op::kValidate:
    case Op::kPing:
      return c->Value(&q.u32);
    case Op::kAuth:
      if ((r = c->Value(&q.u32)) != R::kOk) return r;
      if (q.u32 != kAuthMagic) return R::kTooBig;
      return bytes(lim.max_token_bytes, &q.values);
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      if ((r = key()) != R::kOk) return r;
      return value();
    case Op::kCompareSet:
      if ((r = key()) != R::kOk) return r;
      if ((r = value()) != R::kOk) return r;
      return value();
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      return key();
    case Op::kAdd:
      if ((r = key()) != R::kOk) return r;
      return c->Value(&q.delta);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
    case Op::kMultiSet: {
      uint64_t n = 0;
      if ((r = c->Count(&n)) != R::kOk) return r;
      for (uint64_t i = 0; i < n; ++i) {
        if ((r = key()) != R::kOk) return r;
        if (op == Op::kMultiSet && (r = value()) != R::kOk) return r;
      }
      return R::kOk;
    }
    case Op::kNumKeys:
    case Op::kCancelWait:
      return R::kOk;
  }
  return R::kTooBig;
}

bool IsCounted(Op op) {
  return op == Op::kCheck || op == Op::kWait || op == Op::kMultiGet || op == Op::kMultiSet;
}

// Walks the items of a counted op (uint64 count, then keys, or key/value pairs for MULTI_SET)
// without copying, from where *count/*next/*pos say an earlier walk stopped (*pos == 0: from the
// count, which `c` must be at). *pos/*next advance past every complete item, so that the next call
// resumes there instead of walking the request from its start again.
R WalkItems(Op op, const Limits& lim, Cursor* c, size_t* pos, uint64_t* count, uint64_t* next) {
  if (*pos == 0) {
    if (R r = c->Count(count); r != R::kOk) return r;
    *next = 0;
    *pos = c->pos();
  }
  for (; *next < *count; ++*next) {
    R r = c->Bytes(lim.max_key_bytes, nullptr);
    if (r == R::kOk && op == Op::kMultiSet) r = c->Bytes(lim.max_value_bytes, nullptr);
    if (r != R::kOk) return r;
    *pos = c->pos();
  }
  return R::kOk;
}

}  // namespace

const char* DialectName(Dialect d) {
  switch (d) {
    case Dialect::kUnknown: return "unknown";
    case Dialect::kLegacy: return "legacy (torch<=2.0)";
    case Dialect::kModern: return "modern (torch>=2.1)";
  }
  return "?";
}

const char* OpName(Op op) {
  static constexpr std::array<const char*, kNumOps> kNames = {
      "VALIDATE", "SET",       "COMPARE_SET", "GET",       "ADD",       "CHECK",     "WAIT",
      "GETNUMKEYS", "WATCH_KEY", "DELETE_KEY", "APPEND",    "MULTI_GET", "MULTI_SET",
      "CANCEL_WAIT", "PING",    "QUEUE_PUSH",  "QUEUE_POP", "QUEUE_LEN", "AUTH"};
  auto i = static_cast<size_t>(op);
  return i < kNumOps ? kNames[i] : "?";
}

int WireCode(Dialect d, Op op) {
  if (op == Op::kAuth) return kAuthByte;
  const auto* codes = CodesOf(d);
  auto i = static_cast<size_t>(op);
  return codes && i < kNumOps ? (*codes)[i] : kNone;
}

bool OpFromWire(Dialect d, uint8_t code, Op* op) {
  const auto* codes = CodesOf(d);
  if (!codes) return false;
  for (size_t i = 0; i < kNumOps; ++i) {
    if ((*codes)[i] == code) {
      *op = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

RequestParser::Result RequestParser::Fail(std::string why) {
  error_ = std::move(why);
  return Result::kError;
}

RequestParser::Result RequestParser::Parse(std::string_view in, Request* out, size_t* consumed) {
  if (!error_.empty()) return Result::kError;
  min_bytes_ = 1;
  if (in.empty()) return Result::kNeedMore;
  const auto code = static_cast<uint8_t>(in[0]);
  Dialect d = dialect_;
  Op op = Op::kSet;
  bool have_op = false;
  if (d == Dialect::kUnknown) {
    // First message (or first after AUTH): pick the dialect.
    if (code == kAuthByte) {
      if (!auth_allowed_) return Fail("AUTH is only accepted as the first message");
      op = Op::kAuth;
      have_op = true;
    } else if (code == 0) {
      if (in.size() < 5) {
        min_bytes_ = 5;
        return Result::kNeedMore;
      }
      uint32_t magic;
      std::memcpy(&magic, in.data() + 1, sizeof magic);
      d = magic == kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
    } else if (code <= kLastLegacyCode) {
      d = Dialect::kLegacy;
    } else {
      return Fail("unrecognised first byte " + std::to_string(code) + " (not a TCPStore client)");
    }
  }
  if (!have_op && !OpFromWire(d, code, &op)) {
    return Fail("unknown query type " + std::to_string(code) + " in the " + DialectName(d) +
                " dialect");
  }
  if (op == Op::kValidate && dialect_ != Dialect::kUnknown) {
    return Fail("VALIDATE is only accepted as the first query");
  }

  // First walk the lengths without copying: a large request arrives over many reads, and decoding
  // it from the start after each one copied everything received so far (quadratic in its size).
  // A counted op's walk resumes where the previous call's stopped (same front, per the contract).
  if (walk_.pos != 0 && (walk_.op != op || walk_.pos > in.size())) walk_ = Walk{};
  Cursor walk(in, walk_.pos != 0 ? walk_.pos : 1, limits_);
  walk_.op = op;
  const R walked = IsCounted(op)
                       ? WalkItems(op, limits_, &walk, &walk_.pos, &walk_.count, &walk_.next)
                       : DecodeBody(op, limits_, &walk, nullptr);
  switch (walked) {
    case R::kOk:
      break;
    case R::kShort:
      min_bytes_ = walk.need();
      return Result::kNeedMore;
    case R::kTooBig:
      return Fail(std::string(OpName(op)) + ": declared size over the limit (or bad AUTH magic)");
  }
  walk_ = Walk{};
  // All of it is here and within the limits: decode it, once.
  Request req;
  req.op = op;
  Cursor c(in, 1, limits_);
  if (DecodeBody(op, limits_, &c, &req) != R::kOk || c.pos() != walk.pos()) {
    return Fail(std::string(OpName(op)) + ": decoding disagrees with the walk");  // unreachable
  }
  if (op == Op::kValidate && req.u32 != kValidationMagic) {
    return Fail("VALIDATE with a wrong magic number");  // unreachable: detection checked it
  }
  if (op != Op::kAuth) dialect_ = d;
  auth_allowed_ = false;
  ++requests_;
  *out = std::move(req);
  *consumed = c.pos();
  return Result::kRequest;
}

bool EncodeRequest(Dialect d, const Request& req, std::string* out) {
  int code = WireCode(d, req.op);
  if (req.op == Op::kValidate) code = 0;  // dialect-free: it is what makes a connection modern
  if (code == kNone) return false;
  std::string s;
  AppendU8(&s, static_cast<uint8_t>(code));
  auto key = [&](size_t i) { AppendBytes(&s, i < req.keys.size() ? req.keys[i] : ""); };
  auto value = [&](size_t i) { AppendBytes(&s, i < req.values.size() ? req.values[i] : ""); };
  switch (req.op) {
    case Op::kValidate:
    case Op::kPing:
      AppendU32(&s, req.u32);
      break;
    case Op::kAuth:
      AppendU32(&s, kAuthMagic);
      value(0);
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      key(0);
      value(0);
      break;
    case Op::kCompareSet:
      key(0);
      value(0);
      value(1);
      break;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      key(0);
      break;
    case Op::kAdd:
      key(0);
      AppendI64(&s, req.delta);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
    case Op::kMultiSet:
      AppendU64(&s, req.keys.size());
      for (size_t i = 0; i < req.keys.size(); ++i) {
        key(i);
        if (req.op == Op::kMultiSet) value(i);
      }
      break;
    case Op::kNumKeys:
    case Op::kCancelWait:
      break;
  }
  out->append(s);
  return true;
}

void AppendU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
void AppendU32(std::string* out, uint32_t v) { AppendRaw(out, v); }
void AppendI64(std::string* out, int64_t v) { AppendRaw(out, v); }
void AppendU64(std::string* out, uint64_t v) { AppendRaw(out, v); }
void AppendBytes(std::string* out, std::string_view bytes) {
  AppendU64(out, bytes.size());
  out->append(bytes);
}

bool ReadU8(std::string_view* in, uint8_t* v) { return ReadRaw(in, v); }
bool ReadU32(std::string_view* in, uint32_t* v) { return ReadRaw(in, v); }
bool ReadI64(std::string_view* in, int64_t* v) { return ReadRaw(in, v); }
bool ReadU64(std::string_view* in, uint64_t* v) { return ReadRaw(in, v); }

}  // namespace ctrun::store
