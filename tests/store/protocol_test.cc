// Byte-exact request fixtures for every query type of both dialects, written from torch's TCPStore
// wire format (described in src/store/protocol.h), plus dialect detection, limits and incremental
// parsing.
#include "store/protocol.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "store/store_test_util.h"

namespace ctrun::store {
namespace {

using testing::Hex;
using testing::ToHex;
using R = RequestParser::Result;

Request Req(Op op, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
            int64_t delta = 0, uint32_t u32 = 0) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.delta = delta;
  r.u32 = u32;
  return r;
}

struct Fixture {
  const char* name;
  Dialect dialect;
  const char* hex;
  Request req;
};

// Lengths are uint64 little-endian; key "k" = 6b, "a" = 61, "b" = 62.
const std::vector<Fixture>& Fixtures() {
  static const std::vector<Fixture> f = {
      // torch <= 2.0 (1.13: 0..8, 2.0 adds 9..12). The SET bytes are the ones a 1.13 client
      // sends for store.set("foo", b"bar") (keys get a "/" prefix).
      {"legacy SET", Dialect::kLegacy, "00 0400000000000000 2f666f6f 0300000000000000 626172",
       Req(Op::kSet, {"/foo"}, {"bar"})},
      {"legacy COMPARE_SET", Dialect::kLegacy,
       "01 0100000000000000 6b 0100000000000000 61 0200000000000000 6263",
       Req(Op::kCompareSet, {"k"}, {"a", "bc"})},
      {"legacy GET", Dialect::kLegacy, "02 0100000000000000 6b", Req(Op::kGet, {"k"})},
      {"legacy ADD", Dialect::kLegacy, "03 0100000000000000 6b ffffffffffffffff",
       Req(Op::kAdd, {"k"}, {}, -1)},
      {"legacy CHECK", Dialect::kLegacy,
       "04 0200000000000000 0100000000000000 61 0100000000000000 62",
       Req(Op::kCheck, {"a", "b"})},
      {"legacy WAIT", Dialect::kLegacy, "05 0100000000000000 0100000000000000 61",
       Req(Op::kWait, {"a"})},
      {"legacy GETNUMKEYS", Dialect::kLegacy, "06", Req(Op::kNumKeys)},
      {"legacy WATCH_KEY", Dialect::kLegacy, "07 0100000000000000 6b", Req(Op::kWatchKey, {"k"})},
      {"legacy DELETE_KEY", Dialect::kLegacy, "08 0100000000000000 6b",
       Req(Op::kDeleteKey, {"k"})},
      {"legacy APPEND", Dialect::kLegacy, "09 0100000000000000 6b 0200000000000000 7879",
       Req(Op::kAppend, {"k"}, {"xy"})},
      {"legacy MULTI_GET", Dialect::kLegacy,
       "0a 0200000000000000 0100000000000000 61 0100000000000000 62",
       Req(Op::kMultiGet, {"a", "b"})},
      {"legacy MULTI_SET", Dialect::kLegacy,
       "0b 0200000000000000 0100000000000000 61 0100000000000000 31"
       " 0100000000000000 62 0000000000000000",
       Req(Op::kMultiSet, {"a", "b"}, {"1", ""})},
      {"legacy CANCEL_WAIT", Dialect::kLegacy, "0c", Req(Op::kCancelWait)},
      // torch >= 2.1: VALIDATE first, then everything shifted by one, WATCH_KEY gone.
      {"modern VALIDATE", Dialect::kModern, "00 cef7853c",
       Req(Op::kValidate, {}, {}, 0, kValidationMagic)},
      {"modern SET", Dialect::kModern, "01 0100000000000000 6b 0100000000000000 76",
       Req(Op::kSet, {"k"}, {"v"})},
      {"modern COMPARE_SET", Dialect::kModern,
       "02 0100000000000000 6b 0000000000000000 0100000000000000 76",
       Req(Op::kCompareSet, {"k"}, {"", "v"})},
      {"modern GET", Dialect::kModern, "03 0100000000000000 6b", Req(Op::kGet, {"k"})},
      {"modern ADD", Dialect::kModern, "04 0100000000000000 6b 0500000000000000",
       Req(Op::kAdd, {"k"}, {}, 5)},
      {"modern CHECK", Dialect::kModern, "05 0100000000000000 0100000000000000 61",
       Req(Op::kCheck, {"a"})},
      {"modern WAIT", Dialect::kModern,
       "06 0200000000000000 0100000000000000 61 0100000000000000 62", Req(Op::kWait, {"a", "b"})},
      {"modern GETNUMKEYS", Dialect::kModern, "07", Req(Op::kNumKeys)},
      {"modern DELETE_KEY", Dialect::kModern, "08 0100000000000000 6b",
       Req(Op::kDeleteKey, {"k"})},
      {"modern APPEND", Dialect::kModern, "09 0100000000000000 6b 0100000000000000 7a",
       Req(Op::kAppend, {"k"}, {"z"})},
      {"modern MULTI_GET", Dialect::kModern, "0a 0100000000000000 0100000000000000 61",
       Req(Op::kMultiGet, {"a"})},
      {"modern MULTI_SET", Dialect::kModern,
       "0b 0100000000000000 0100000000000000 61 0100000000000000 31",
       Req(Op::kMultiSet, {"a"}, {"1"})},
      {"modern CANCEL_WAIT", Dialect::kModern, "0c", Req(Op::kCancelWait)},
      {"modern PING", Dialect::kModern, "0d 04030201", Req(Op::kPing, {}, {}, 0, 0x01020304)},
      {"modern QUEUE_PUSH", Dialect::kModern, "0e 0100000000000000 71 0100000000000000 31",
       Req(Op::kQueuePush, {"q"}, {"1"})},
      {"modern QUEUE_POP", Dialect::kModern, "0f 0100000000000000 71", Req(Op::kQueuePop, {"q"})},
      {"modern QUEUE_LEN", Dialect::kModern, "10 0100000000000000 71", Req(Op::kQueueLen, {"q"})},
  };
  return f;
}

// A parser positioned after the handshake of `d` (nothing for legacy, VALIDATE for modern).
RequestParser ParserFor(Dialect d) {
  RequestParser p;
  if (d == Dialect::kModern) {
    Request r;
    size_t used = 0;
    EXPECT_EQ(p.Parse(Hex("00 cef7853c"), &r, &used), R::kRequest);
    EXPECT_EQ(used, 5u);
  }
  return p;
}

TEST(StoreProtocol, EveryFixtureParsesAndEncodesByteExact) {
  for (const auto& f : Fixtures()) {
    SCOPED_TRACE(f.name);
    const std::string bytes = Hex(f.hex);
    RequestParser p = f.req.op == Op::kValidate ? RequestParser() : ParserFor(f.dialect);
    Request got;
    size_t used = 0;
    ASSERT_EQ(p.Parse(bytes, &got, &used), R::kRequest) << p.error();
    EXPECT_EQ(used, bytes.size());
    EXPECT_EQ(got, f.req);
    EXPECT_EQ(p.dialect(), f.dialect);
    std::string enc;
    ASSERT_TRUE(EncodeRequest(f.dialect, f.req, &enc));
    EXPECT_EQ(ToHex(enc), ToHex(bytes));
  }
}

TEST(StoreProtocol, EveryFixtureIsIncremental) {
  // Fed one byte at a time, nothing is returned until the last byte, and min_bytes never asks for
  // more than the request holds.
  for (const auto& f : Fixtures()) {
    SCOPED_TRACE(f.name);
    const std::string bytes = Hex(f.hex);
    RequestParser p = f.req.op == Op::kValidate ? RequestParser() : ParserFor(f.dialect);
    Request got;
    size_t used = 0;
    for (size_t n = 0; n < bytes.size(); ++n) {
      ASSERT_EQ(p.Parse(std::string_view(bytes).substr(0, n), &got, &used), R::kNeedMore) << n;
      EXPECT_GT(p.min_bytes(), n);
      EXPECT_LE(p.min_bytes(), bytes.size());
    }
    ASSERT_EQ(p.Parse(bytes, &got, &used), R::kRequest);
    EXPECT_EQ(got, f.req);
  }
}

TEST(StoreProtocol, OpsMissingFromADialectAreRefused) {
  std::string out;
  EXPECT_FALSE(EncodeRequest(Dialect::kLegacy, Req(Op::kPing), &out));
  EXPECT_FALSE(EncodeRequest(Dialect::kLegacy, Req(Op::kQueuePush, {"q"}, {"v"}), &out));
  EXPECT_FALSE(EncodeRequest(Dialect::kModern, Req(Op::kWatchKey, {"k"}), &out));
  EXPECT_TRUE(out.empty());
  // Legacy 13 (PING in the modern dialect) is unknown.
  RequestParser legacy = ParserFor(Dialect::kLegacy);
  Request r;
  size_t used;
  ASSERT_EQ(legacy.Parse(Hex("06"), &r, &used), R::kRequest);
  EXPECT_EQ(legacy.Parse(Hex("0d 01000000"), &r, &used), R::kError);
  // Modern 17 is unknown; a second VALIDATE is refused.
  RequestParser modern = ParserFor(Dialect::kModern);
  EXPECT_EQ(modern.Parse(Hex("11"), &r, &used), R::kError);
  RequestParser modern2 = ParserFor(Dialect::kModern);
  EXPECT_EQ(modern2.Parse(Hex("00 cef7853c"), &r, &used), R::kError);
}

TEST(StoreProtocol, DialectDetection) {
  Request r;
  size_t used;
  {
    RequestParser p;  // 0 + magic: modern
    EXPECT_EQ(p.Parse(Hex("00 ce"), &r, &used), R::kNeedMore);
    EXPECT_EQ(p.min_bytes(), 5u);
    EXPECT_EQ(p.dialect(), Dialect::kUnknown);
    EXPECT_EQ(p.Parse(Hex("00 cef7853c 07"), &r, &used), R::kRequest);
    EXPECT_EQ(p.dialect(), Dialect::kModern);
    EXPECT_EQ(p.Parse(Hex("07"), &r, &used), R::kRequest);
    EXPECT_EQ(r.op, Op::kNumKeys);
  }
  {
    RequestParser p;  // 0 + anything else: legacy SET
    EXPECT_EQ(p.Parse(Hex("00 0100000000000000 6b 0000000000000000"), &r, &used), R::kRequest);
    EXPECT_EQ(p.dialect(), Dialect::kLegacy);
    EXPECT_EQ(r.op, Op::kSet);
    // 7 is WATCH_KEY in the legacy dialect, GETNUMKEYS in the modern one.
    EXPECT_EQ(p.Parse(Hex("07 0100000000000000 6b"), &r, &used), R::kRequest);
    EXPECT_EQ(r.op, Op::kWatchKey);
  }
  for (int first = 1; first <= 12; ++first) {
    RequestParser p;
    std::string b(1, static_cast<char>(first));
    p.Parse(b, &r, &used);
    EXPECT_NE(p.dialect(), Dialect::kModern);
    EXPECT_TRUE(p.error().empty()) << first;
  }
  for (int first : {13, 16, 0x20, 0x47 /* 'G' of an HTTP GET */, 0xff}) {
    RequestParser p;
    std::string b(1, static_cast<char>(first));
    EXPECT_EQ(p.Parse(b + "ET / HTTP/1.0\r\n", &r, &used), R::kError) << first;
  }
  {
    // A wrong magic is a legacy SET whose key length is ~1 GiB: over the key limit.
    RequestParser p;
    EXPECT_EQ(p.Parse(Hex("00 cef7853d 00000000"), &r, &used), R::kError);
  }
}

TEST(StoreProtocol, AuthOnlyFirstThenAnyDialect) {
  Request r;
  size_t used;
  RequestParser p;
  std::string auth = Hex("f5 43545241 0200000000000000 7333");
  ASSERT_EQ(p.Parse(auth, &r, &used), R::kRequest);
  EXPECT_EQ(r, Req(Op::kAuth, {}, {"s3"}, 0, kAuthMagic));
  EXPECT_EQ(p.dialect(), Dialect::kUnknown);
  std::string enc;
  ASSERT_TRUE(EncodeRequest(Dialect::kModern, r, &enc));
  EXPECT_EQ(ToHex(enc), ToHex(auth));
  ASSERT_EQ(p.Parse(Hex("00 cef7853c"), &r, &used), R::kRequest);
  EXPECT_EQ(p.dialect(), Dialect::kModern);
  RequestParser late = ParserFor(Dialect::kModern);
  EXPECT_EQ(late.Parse(auth, &r, &used), R::kError);
  RequestParser bad_magic;
  EXPECT_EQ(bad_magic.Parse(Hex("f5 00000000 0000000000000000"), &r, &used), R::kError);
  RequestParser long_token;
  EXPECT_EQ(long_token.Parse(Hex("f5 43545241 0120000000000000"), &r, &used), R::kError);
}

TEST(StoreProtocol, DeclaredSizesOverTheLimitFailBeforeTheBytesArrive) {
  Limits lim;
  lim.max_key_bytes = 16;
  lim.max_value_bytes = 1024;
  lim.max_keys_per_request = 4;
  lim.max_request_bytes = 2048;
  Request r;
  size_t used;
  auto fails = [&](Dialect d, const std::string& hex) {
    RequestParser p(lim);
    if (d == Dialect::kModern) p.Parse(Hex("00 cef7853c"), &r, &used);
    return p.Parse(Hex(hex), &r, &used) == R::kError;
  };
  EXPECT_TRUE(fails(Dialect::kLegacy, "00 1100000000000000"));                    // key 17 > 16
  EXPECT_TRUE(fails(Dialect::kLegacy, "00 0000000000000000 0104000000000000"));  // value 1025
  EXPECT_TRUE(fails(Dialect::kLegacy, "00 ffffffffffffffff"));                    // 2^64-1
  EXPECT_TRUE(fails(Dialect::kModern, "01 0100000000000000 6b 0000000000010000"));  // 2^40
  EXPECT_TRUE(fails(Dialect::kModern, "06 0500000000000000"));                    // 5 keys > 4
  EXPECT_TRUE(fails(Dialect::kModern, "0a 0000000000000080"));                    // 2^63 keys
  // Whole request: 3 values of 1000 bytes are each fine but together over 2048.
  std::string ms = "0b 0300000000000000";
  std::string big(2000, 'a');  // 1000 bytes of 0xaa
  for (int i = 0; i < 3; ++i) ms += " 0100000000000000 6b e803000000000000 " + big;
  EXPECT_TRUE(fails(Dialect::kModern, ms));
  // Just under the limits is fine.
  RequestParser ok(lim);
  EXPECT_EQ(ok.Parse(Hex("00 1000000000000000") + std::string(16, 'k') + Hex("0004000000000000") +
                         std::string(1024, 'v'),
                     &r, &used),
            R::kRequest);
}

TEST(StoreProtocol, PipelinedRequestsComeOutInOrder) {
  std::string stream;
  std::vector<Request> want;
  for (int i = 0; i < 50; ++i) {
    Request r = Req(Op::kAdd, {"c" + std::to_string(i)}, {}, i);
    ASSERT_TRUE(EncodeRequest(Dialect::kLegacy, r, &stream));
    want.push_back(r);
  }
  RequestParser p;
  std::string_view in(stream);
  for (const auto& w : want) {
    Request got;
    size_t used = 0;
    ASSERT_EQ(p.Parse(in, &got, &used), R::kRequest);
    EXPECT_EQ(got, w);
    in.remove_prefix(used);
  }
  EXPECT_TRUE(in.empty());
  EXPECT_EQ(p.requests(), 50u);
}

// A large MULTI_SET arrives over many reads, and the server calls Parse after each one that
// reaches min_bytes(). Parse used to decode the request from its start every time, copying every
// key and value received so far: here 4096 calls over a 64 MiB request copied about 128 GiB (tens
// of seconds). It now only walks the lengths until the request is complete, then decodes it once.
TEST(StoreProtocol, ALargeRequestFedInPiecesIsDecodedOnce) {
  constexpr size_t kPairs = 8 * 1024;
  constexpr size_t kValueBytes = 8 * 1024;
  constexpr size_t kPiece = 16 * 1024;
  std::string bytes = Hex("0b");  // legacy MULTI_SET
  AppendU64(&bytes, kPairs);
  for (size_t i = 0; i < kPairs; ++i) {
    AppendBytes(&bytes, "key" + std::to_string(i));
    AppendBytes(&bytes, std::string(kValueBytes, static_cast<char>('a' + i % 26)));
  }
  RequestParser p;
  Request got;
  size_t used = 0;
  R res = R::kNeedMore;
  size_t calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t have = 0; res == R::kNeedMore && have < bytes.size();) {
    have = std::min(bytes.size(), have + kPiece);
    if (have < p.min_bytes()) continue;  // as the server does: no call before min_bytes()
    ++calls;
    res = p.Parse(std::string_view(bytes).substr(0, have), &got, &used);
    if (res == R::kNeedMore) {
      EXPECT_GT(p.min_bytes(), have);
    }
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(res, R::kRequest) << p.error();
  EXPECT_EQ(used, bytes.size());
  ASSERT_EQ(got.keys.size(), kPairs);
  ASSERT_EQ(got.values.size(), kPairs);
  EXPECT_EQ(got.keys[kPairs - 1], "key" + std::to_string(kPairs - 1));
  EXPECT_EQ(got.values[kPairs - 1], std::string(kValueBytes, static_cast<char>('a' + (kPairs - 1) % 26)));
  EXPECT_GT(calls, 4000u);  // every piece crossed a field boundary: one call per piece
  EXPECT_LT(took, std::chrono::seconds(3)) << calls << " calls";
}

// The walk of an incomplete request resumes where it stopped; given less than it walked (not
// what the server does), it starts over rather than read past the input.
TEST(StoreProtocol, AWalkGivenLessThanItWalkedStartsOver) {
  const Request want = Req(Op::kMultiSet, {"a", "bb", "ccc"}, {"1", "22", "333"});
  std::string bytes;
  ASSERT_TRUE(EncodeRequest(Dialect::kLegacy, want, &bytes));
  RequestParser p;
  Request got;
  size_t used = 0;
  ASSERT_EQ(p.Parse(std::string_view(bytes).substr(0, bytes.size() - 1), &got, &used), R::kNeedMore);
  EXPECT_EQ(p.min_bytes(), bytes.size());
  ASSERT_EQ(p.Parse(std::string_view(bytes).substr(0, 12), &got, &used), R::kNeedMore);
  EXPECT_GT(p.min_bytes(), 12u);
  EXPECT_LT(p.min_bytes(), bytes.size());
  ASSERT_EQ(p.Parse(bytes, &got, &used), R::kRequest) << p.error();
  EXPECT_EQ(got, want);
  EXPECT_EQ(used, bytes.size());
}

TEST(StoreProtocol, ReplyEncoders) {
  std::string s;
  AppendBytes(&s, "bar");
  EXPECT_EQ(ToHex(s), "0300000000000000626172");
  s.clear();
  AppendI64(&s, -2);
  EXPECT_EQ(ToHex(s), "feffffffffffffff");
  s.clear();
  AppendU32(&s, kValidationMagic);
  EXPECT_EQ(ToHex(s), "cef7853c");
  s.clear();
  AppendU8(&s, kKeyCallbackRegistered);
  AppendU8(&s, kWaitCanceled);
  AppendU8(&s, kCheckNotReady);
  EXPECT_EQ(ToHex(s), "030101");
  std::string_view v(s);
  uint8_t b;
  ASSERT_TRUE(ReadU8(&v, &b));
  EXPECT_EQ(b, 3);
  int64_t x;
  EXPECT_FALSE(ReadI64(&v, &x));  // too short, nothing consumed
  EXPECT_EQ(v.size(), 2u);
}

TEST(StoreProtocol, RandomBytesNeverCrashAndErrorsAreSticky) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 2000; ++round) {
    std::string in(rng() % 64, '\0');
    for (auto& ch : in) ch = static_cast<char>(rng());
    RequestParser p;
    std::string_view v(in);
    for (int i = 0; i < 64; ++i) {
      Request r;
      size_t used = 0;
      auto res = p.Parse(v, &r, &used);
      if (res != R::kRequest) {
        if (res == R::kError) {
          EXPECT_EQ(p.Parse(v, &r, &used), R::kError);
        }
        break;
      }
      ASSERT_GT(used, 0u);
      v.remove_prefix(used);
    }
  }
}

}  // namespace
}  // namespace ctrun::store
