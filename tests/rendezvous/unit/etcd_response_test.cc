#include "rendezvous/etcd_response.h"

#include <gtest/gtest.h>

namespace ctrun::rdzv {
namespace {

std::string B(std::string_view s) { return EtcdBase64(s); }

TEST(EtcdBase64, RoundTripsEveryLengthAndEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += char(c);
  for (size_t n = 0; n <= all.size(); n += (n < 8 ? 1 : 37)) {
    auto back = EtcdUnBase64(EtcdBase64(all.substr(0, n)));
    ASSERT_TRUE(back.ok()) << n << ": " << back.message();
    EXPECT_EQ(*back, all.substr(0, n));
  }
  EXPECT_EQ(EtcdBase64("ab"), "YWI=");
  EXPECT_EQ(*EtcdUnBase64("YWI"), "ab");  // padding is optional
  EXPECT_EQ(*EtcdUnBase64(""), "");
}

TEST(EtcdBase64, RejectsWhatIsNotStandardBase64) {
  for (const char* bad : {"Y", "YWJjZ", "YW=I", "YW-_", "Y===", "====", "YWI==", "YWI=YWI=", "YW I", "YWJj\n"})
    EXPECT_FALSE(EtcdUnBase64(bad).ok()) << "'" << bad << "'";
}

TEST(EtcdResponse, RangeDecodesKeysValuesAndRevisions) {
  const std::string body = R"({"header":{"cluster_id":"1","revision":"42"},"kvs":[{"key":")" + B("/a/b") +
                           R"(","create_revision":"7","mod_revision":"41","version":"3","value":")" + B(std::string("v\0x", 3)) +
                           R"(","lease":"694d71"}],"count":"5","more":true})";
  // "694d71" is not a decimal int64: rejected below; first the well-formed answer.
  auto bad = DecodeEtcdRange(body);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("'lease' is not an int64"), std::string::npos) << bad.message();

  std::string good = body;
  good.replace(good.find("694d71"), 6, "7587");
  auto r = DecodeEtcdRange(good);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->revision, 42);
  EXPECT_EQ(r->count, 5);
  EXPECT_TRUE(r->more);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0], (EtcdKeyValue{"/a/b", std::string("v\0x", 3), 7, 41, 3, 7587}));
}

TEST(EtcdResponse, AbsentFieldsAreZeroAndEmpty) {
  auto r = DecodeEtcdRange(R"({"header":{"revision":"9"}})");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->revision, 9);
  EXPECT_TRUE(r->kvs.empty());
  EXPECT_EQ(r->count, 0);
  EXPECT_FALSE(r->more);
  auto d = DecodeEtcdDelete(R"({"header":{"revision":"10"},"deleted":"2"})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->revision, 10);
  EXPECT_EQ(d->deleted, 2);
  EXPECT_EQ(*DecodeEtcdRevision(R"({"header":{}})"), 0);
}

TEST(EtcdResponse, MalformedAnswersAreErrorsNeverZeros) {
  const char* bad_ranges[] = {
      "",
      "not json",
      "[]",
      R"("a string")",
      R"({"header":{"revision":"12x"}})",
      R"({"header":{"revision":"-3"}})",
      R"({"header":{"revision":1.5}})",
      R"({"header":{"revision":"99999999999999999999"}})",
      R"({"header":{"revision":18446744073709551615}})",
      R"({"header":[]})",
      R"({"kvs":{}})",
      R"({"kvs":[1]})",
      R"({"kvs":[{"key":"%%%"}]})",
      R"({"kvs":[{"key":7}]})",
      R"({"more":"yes"})",
      R"({"count":"-1"})",
  };
  for (const char* body : bad_ranges) {
    auto r = DecodeEtcdRange(body);
    EXPECT_FALSE(r.ok()) << body;
    if (!r.ok()) {
      EXPECT_NE(r.message().find("etcd range answer"), std::string::npos) << r.message();
    }
  }
}

TEST(EtcdResponse, CreateTxnCreatedOrExisting) {
  auto won = DecodeEtcdCreate(R"({"header":{"revision":"5"},"succeeded":true})", "k", "v", 77);
  ASSERT_TRUE(won.ok()) << won.message();
  EXPECT_TRUE(won->created);
  EXPECT_EQ(won->kv, (EtcdKeyValue{"k", "v", 5, 5, 1, 77}));

  const std::string lost = R"({"header":{"revision":"6"},"responses":[{"response_range":{"kvs":[{"key":")" + B("k") +
                           R"(","value":")" + B("theirs") + R"(","create_revision":"3","mod_revision":"3","version":"1"}]}}]})";
  auto r = DecodeEtcdCreate(lost, "k", "v", 0);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_FALSE(r->created);
  EXPECT_EQ(r->revision, 6);
  EXPECT_EQ(r->kv.value, "theirs");
  EXPECT_EQ(r->kv.create_revision, 3);

  auto none = DecodeEtcdCreate(R"({"header":{"revision":"6"},"responses":[{"response_range":{}}]})", "k", "v", 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("neither created nor found"), std::string::npos);
  EXPECT_FALSE(DecodeEtcdCreate(R"({"responses":[7]})", "k", "v", 0).ok());
  EXPECT_FALSE(DecodeEtcdCreate(R"({"responses":{"response_range":{}}})", "k", "v", 0).ok());
}

TEST(EtcdResponse, LeasesAndTokens) {
  auto g = DecodeEtcdLeaseGrant(R"({"header":{"revision":"2"},"ID":"7587869","TTL":"5"})");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->id, 7587869);
  EXPECT_EQ(g->ttl, 5);
  auto refused = DecodeEtcdLeaseGrant(R"({"error":"too many leases"})");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.message(), "etcd lease grant: too many leases");
  EXPECT_EQ(*DecodeEtcdKeepAlive(R"({"result":{"ID":"1","TTL":"4"}})"), 4);
  EXPECT_EQ(*DecodeEtcdKeepAlive(R"({"result":{"ID":"1"}})"), 0);  // gone
  EXPECT_FALSE(DecodeEtcdKeepAlive(R"({"result":"x"})").ok());
  EXPECT_EQ(*DecodeEtcdAuthToken(R"({"token":"abc.123"})"), "abc.123");
  EXPECT_FALSE(DecodeEtcdAuthToken(R"({"token":5})").ok());
}

TEST(EtcdResponse, ClassifiesHttpAnswers) {
  EXPECT_EQ(ClassifyEtcdAnswer(200, R"({"header":{}})").verdict, EtcdVerdict::kOk);
  EtcdAnswer unreadable = ClassifyEtcdAnswer(200, "<html>");
  EXPECT_EQ(unreadable.verdict, EtcdVerdict::kFail);
  EXPECT_EQ(unreadable.message, "unreadable answer: <html>");
  EtcdAnswer stream = ClassifyEtcdAnswer(200, R"({"error":{"grpc_code":14,"http_code":503,"message":"no leader"}})");
  EXPECT_EQ(stream.verdict, EtcdVerdict::kRetry);
  EXPECT_EQ(stream.status, 503);
  EXPECT_EQ(stream.message, "no leader");
  EtcdAnswer token = ClassifyEtcdAnswer(400, R"({"error":"etcdserver: invalid auth token","code":3})");
  EXPECT_EQ(token.verdict, EtcdVerdict::kAuth);
  EXPECT_EQ(token.message, "etcdserver: invalid auth token");
  EXPECT_EQ(ClassifyEtcdAnswer(401, "").verdict, EtcdVerdict::kAuth);
  EXPECT_EQ(ClassifyEtcdAnswer(429, "slow down").verdict, EtcdVerdict::kRetry);
  EtcdAnswer fail = ClassifyEtcdAnswer(404, "");
  EXPECT_EQ(fail.verdict, EtcdVerdict::kFail);
  EXPECT_EQ(fail.message, "(empty answer)");
  EXPECT_EQ(ClassifyEtcdAnswer(400, R"({"message":"bad key"})").message, "bad key");
  EXPECT_EQ(ClassifyEtcdAnswer(200, R"({"error":{"http_code":"x"}})").verdict, EtcdVerdict::kFail);
}

TEST(EtcdResponse, WatchMessages) {
  using Kind = EtcdWatchMessage::Kind;
  auto created = DecodeEtcdWatchMessage(R"({"result":{"header":{"revision":"8"},"created":true}})");
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->kind, Kind::kCreated);
  EXPECT_EQ(created->revision, 8);

  auto progress = DecodeEtcdWatchMessage(R"({"result":{"header":{"revision":"9"}}})");
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ(progress->kind, Kind::kProgress);
  EXPECT_EQ(progress->revision, 9);

  const std::string events = R"({"result":{"header":{"revision":"11"},"events":[{"kv":{"key":")" + B("a") +
                             R"(","value":")" + B("1") + R"(","mod_revision":"10"}},{"type":"DELETE","kv":{"key":")" +
                             B("b") + R"(","mod_revision":"11"}}]}})";
  auto ev = DecodeEtcdWatchMessage(events);
  ASSERT_TRUE(ev.ok()) << ev.message();
  EXPECT_EQ(ev->kind, Kind::kEvents);
  ASSERT_EQ(ev->events.size(), 2u);
  EXPECT_EQ(ev->events[0].type, EtcdEventType::kPut);
  EXPECT_EQ(ev->events[0].kv.value, "1");
  EXPECT_EQ(ev->events[1].type, EtcdEventType::kDelete);
  EXPECT_EQ(ev->events[1].kv.key, "b");
  EXPECT_EQ(ev->events[1].kv.mod_revision, 11);

  auto compacted = DecodeEtcdWatchMessage(
      R"({"result":{"canceled":true,"compact_revision":"30","cancel_reason":"mvcc: required revision has been compacted"}})");
  ASSERT_TRUE(compacted.ok());
  EXPECT_EQ(compacted->kind, Kind::kCanceled);
  EXPECT_EQ(compacted->compact_revision, 30);

  auto err = DecodeEtcdWatchMessage(R"({"error":{"http_code":401,"message":"etcdserver: invalid auth token"}})");
  ASSERT_TRUE(err.ok());
  EXPECT_EQ(err->kind, Kind::kError);
  EXPECT_TRUE(err->token_error);

  for (const char* bad : {"", "{", "null", R"({"result":[]})", R"({"result":{"events":[{"type":"MOVE","kv":{}}]}})",
                          R"({"result":{"events":[{"kv":{"key":"***"}}]}})", R"({"result":{"events":[{}]}})",
                          R"({"result":{"created":"true"}})", R"({"result":{"canceled":true,"compact_revision":"-1"}})"})
    EXPECT_FALSE(DecodeEtcdWatchMessage(bad).ok()) << bad;
}

}  // namespace
}  // namespace ctrun::rdzv
