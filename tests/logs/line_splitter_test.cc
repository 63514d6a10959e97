#include "logs/line_splitter.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ctrun::logs {
namespace {

struct Got {
  std::string text;
  LineEnd end;
  bool cont;
  bool operator==(const Got& o) const { return text == o.text && end == o.end && cont == o.cont; }
};
std::ostream& operator<<(std::ostream& os, const Got& g) {
  return os << "{'" << g.text << "'," << static_cast<int>(g.end) << "," << g.cont << "}";
}

std::vector<Got> Split(const std::vector<std::string>& feeds, size_t max_line = 64 * 1024, bool finish = true) {
  LineSplitter s(max_line);
  std::vector<Got> out;
  auto emit = [&](const LineUnit& u) { out.push_back({std::string(u.text), u.end, u.continuation}); };
  for (const auto& f : feeds) s.Feed(f, emit);
  if (finish) s.Finish(emit);
  return out;
}

constexpr LineEnd NL = LineEnd::kNewline, CR = LineEnd::kReturn, CUT = LineEnd::kCut, EOFL = LineEnd::kEof;

TEST(LineSplitter, WholeAndEmptyLines) {
  EXPECT_EQ(Split({"a\n\nbc\n"}), (std::vector<Got>{{"a", NL, false}, {"", NL, false}, {"bc", NL, false}}));
  EXPECT_TRUE(Split({""}).empty());
}

TEST(LineSplitter, PartialLinesJoinAcrossFeeds) {
  EXPECT_EQ(Split({"hel", "lo wo", "rld\nne", "xt\n"}),
            (std::vector<Got>{{"hello world", NL, false}, {"next", NL, false}}));
}

TEST(LineSplitter, PartialLastLineFlushedAtEof) {
  EXPECT_EQ(Split({"one\ntwo"}), (std::vector<Got>{{"one", NL, false}, {"two", EOFL, false}}));
  EXPECT_EQ(Split({"one\ntwo"}, 1024, false), (std::vector<Got>{{"one", NL, false}}));
}

TEST(LineSplitter, CarriageReturnUnits) {
  EXPECT_EQ(Split({"\r 10%\r 20%\r100%\n"}),
            (std::vector<Got>{{"", CR, false}, {" 10%", CR, false}, {" 20%", CR, false}, {"100%", NL, false}}));
}

TEST(LineSplitter, CrLfIsOneNewline) {
  EXPECT_EQ(Split({"dos\r\nline\r\n"}), (std::vector<Got>{{"dos\r", NL, false}, {"line\r", NL, false}}));
  // '\r' as the last byte of a feed waits for the next byte.
  EXPECT_EQ(Split({"dos\r", "\nx\r", "y\n"}),
            (std::vector<Got>{{"dos\r", NL, false}, {"x", CR, false}, {"y", NL, false}}));
  EXPECT_EQ(Split({"bar\r"}), (std::vector<Got>{{"bar", CR, false}}));
}

TEST(LineSplitter, LongLinesAreCutAndBounded) {
  std::string longline(40, 'x');
  auto got = Split({longline + "\n"}, 16);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], (Got{std::string(16, 'x'), CUT, false}));
  EXPECT_EQ(got[1], (Got{std::string(16, 'x'), CUT, true}));
  EXPECT_EQ(got[2], (Got{std::string(8, 'x'), NL, true}));
  // Same units when the line arrives byte by byte, and the buffer never exceeds max_line.
  LineSplitter s(16);
  std::vector<Got> out;
  for (char c : longline + "\n") {
    s.Feed(std::string_view(&c, 1), [&](const LineUnit& u) { out.push_back({std::string(u.text), u.end, u.continuation}); });
    EXPECT_LE(s.pending_bytes(), 16u);
  }
  EXPECT_EQ(out, got);
}

TEST(LineSplitter, CutNeverSplitsUtf8Sequence) {
  // 15 ASCII bytes then a 3-byte character straddling the 16-byte limit.
  std::string line = std::string(15, 'a') + "\xE2\x82\xAC" + "tail\n";
  auto got = Split({line}, 16);
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[0].text, std::string(15, 'a'));
  EXPECT_EQ(got[1].text.substr(0, 3), "\xE2\x82\xAC");
}

TEST(LineSplitter, InvalidUtf8AndBinaryPassThrough) {
  std::string junk = std::string("\xff\xfe\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\0z", 20);
  auto got = Split({junk + "\n"}, 16);
  std::string joined;
  for (auto& g : got) joined += g.text;
  EXPECT_EQ(joined, junk);
}

TEST(LineSplitter, ArbitraryChunkingGivesTheSameUnits) {
  std::mt19937 rng(42);
  std::string data;
  const char alphabet[] = "ab\n\r\xC3\xA9 ";
  for (int i = 0; i < 20000; ++i) data.push_back(alphabet[rng() % (sizeof alphabet - 1)]);
  auto whole = Split({data}, 32);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> feeds;
    size_t pos = 0;
    while (pos < data.size()) {
      size_t n = 1 + rng() % 50;
      feeds.push_back(data.substr(pos, n));
      pos += n;
    }
    ASSERT_EQ(Split(feeds, 32), whole) << "trial " << trial;
  }
}

}  // namespace
}  // namespace ctrun::logs
