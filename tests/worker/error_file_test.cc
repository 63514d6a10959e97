// Error file: the torchelastic JSON document, atomic writes, and acceptance by torch's own reader
// (Debian python3-torch 1.13: torch.distributed.elastic.multiprocessing.errors.ProcessFailure).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "ctrun/error_file.h"
#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::TempDir;

TEST(ErrorFile, JsonHasTorchelasticShape) {
  const std::string doc = error_file_json("RuntimeError: boom", "trace\nline 2", 1700000000);
  auto j = nlohmann::json::parse(doc);
  EXPECT_EQ(j["message"]["message"], "RuntimeError: boom");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], "trace\nline 2");
  ASSERT_TRUE(j["message"]["extraInfo"]["timestamp"].is_string());  // the reader int()s a string
  EXPECT_EQ(j["message"]["extraInfo"]["timestamp"], "1700000000");
  EXPECT_EQ(j["message"]["extraInfo"]["ctrun_timestamp_ns"], "1700000000000000000");
  auto precise = nlohmann::json::parse(error_file_json("m", "c", 1700000000, 1700000000123456789LL));
  EXPECT_EQ(precise["message"]["extraInfo"]["ctrun_timestamp_ns"], "1700000000123456789");
}

TEST(ErrorFile, NoCallstackLeavesOutThePyCallstackKey) {
  auto j = nlohmann::json::parse(error_file_json("RuntimeError: no stack here", "", 1700000000));
  EXPECT_EQ(j["message"]["message"], "RuntimeError: no stack here");
  EXPECT_FALSE(j["message"]["extraInfo"].contains("py_callstack")) << j.dump();
  EXPECT_EQ(j["message"]["extraInfo"]["timestamp"], "1700000000");
  EXPECT_EQ(j["message"]["extraInfo"]["ctrun_timestamp_ns"], "1700000000000000000");
}

// torch's ChildFailedError prints py_callstack when the key exists, else the message.
TEST(ErrorFile, TorchShowsTheMessageWhenThereIsNoCallstack) {
  TempDir dir;
  const std::string path = dir / "error.json";
  ASSERT_TRUE(record_error_to(path, "RuntimeError: no stack here"));
  const std::string py =
      "import sys\n"
      "from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure\n"
      "f = ProcessFailure(local_rank=0, pid=123, exitcode=1, error_file=sys.argv[1])\n"
      "print(ChildFailedError('train', {0: f}).format_msg())\n";
  auto r = RunCommand({"/usr/bin/python3", "-c", py, path}, {}, std::chrono::seconds(60));
  if (r.exit_code != 0 && r.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP() << "Debian python3-torch not installed";
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("traceback : RuntimeError: no stack here"), std::string::npos) << r.out;
}

TEST(ErrorFile, EscapesControlQuotesAndInvalidUtf8) {
  const std::string nasty = std::string("q\"b\\s\x01\x7f tab\t \xc3\xa9 bad:\xff\xc3 end");
  const std::string doc = error_file_json(nasty, "", 1);
  auto j = nlohmann::json::parse(doc);  // throws on invalid JSON or invalid UTF-8
  const std::string back = j["message"]["message"];
  EXPECT_EQ(back.substr(0, 5), "q\"b\\s");
  EXPECT_NE(back.find("\xc3\xa9"), std::string::npos);      // valid UTF-8 kept
  EXPECT_NE(back.find("\xef\xbf\xbd"), std::string::npos);  // invalid bytes replaced
}

// ctrun reads at most 1 MiB of an error file (kMaxErrorFileBytes in src/report/error_file.h).
constexpr size_t kReaderLimit = 1 << 20;

TEST(ErrorFile, LongMessageAndCallstackAreCappedHeadAndTail) {
  // 2-byte characters, with the cut points falling inside them on either side.
  std::string body;
  while (body.size() < 600 * 1024) body += "\xc3\xa9";
  const std::string message = "HEAD-" + body + "-TAIL";  // both cut points land mid-character
  const std::string stack = "Traceback\n" + body + "\nlast line";
  const std::string doc = error_file_json(message, stack, 1700000000);
  EXPECT_LT(doc.size(), kReaderLimit);
  auto j = nlohmann::json::parse(doc);  // valid JSON and valid UTF-8
  const std::string m = j["message"]["message"];
  const std::string c = j["message"]["extraInfo"]["py_callstack"];
  for (const std::string* s : {&m, &c}) {
    EXPECT_LE(s->size(), kMaxErrorTextBytes);
    EXPECT_GT(s->size(), kMaxErrorTextBytes - 100);
    EXPECT_EQ(s->find("\xef\xbf\xbd"), std::string::npos) << "a character was split";
  }
  EXPECT_EQ(m.rfind("HEAD-\xc3\xa9", 0), 0u);
  EXPECT_EQ(m.substr(m.size() - 7), "\xc3\xa9-TAIL");
  EXPECT_EQ(c.rfind("Traceback\n", 0), 0u);
  EXPECT_EQ(c.substr(c.size() - 10), "\nlast line");
  // The marker names the number of bytes left out.
  const auto open = m.find("\n... [");
  const auto close = m.find(" bytes cut] ...\n");
  ASSERT_TRUE(open != std::string::npos && close != std::string::npos) << m.substr(0, 100);
  const size_t cut = std::stoul(m.substr(open + 6, close - open - 6));
  EXPECT_EQ(m.size() - (close + 16 - open) + cut, message.size());
  // Short texts are untouched.
  EXPECT_EQ(nlohmann::json::parse(error_file_json("short", "stack", 1))["message"]["message"], "short");
}

TEST(ErrorFile, WorstCaseEscapingStaysWithinTheReaderLimit) {
  const std::string controls(900 * 1024, '\x01');  // each becomes \u0001, six bytes
  TempDir dir;
  const std::string path = dir / "error.json";
  ASSERT_TRUE(record_error_to(path, controls, controls));
  const std::string doc = ReadFileOr(path);
  EXPECT_LT(doc.size(), kReaderLimit);
  auto j = nlohmann::json::parse(doc);
  EXPECT_NE(std::string(j["message"]["message"]).find(" bytes cut] "), std::string::npos);
}

TEST(ErrorFile, RecordWritesAtomicallyAndLeavesNoTempFiles) {
  TempDir dir;
  const std::string path = dir / "error.json";
  ASSERT_TRUE(record_error_to(path, "first", "cs"));
  ASSERT_TRUE(record_error_to(path, "second", "cs"));
  auto j = nlohmann::json::parse(ReadFileOr(path));
  EXPECT_EQ(j["message"]["message"], "second");
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(ErrorFile, NoOpWithoutErrorFileVariable) {
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_FALSE(record_error("nothing"));
  EXPECT_FALSE(record_error_to("", "nothing"));
}

TEST(ErrorFile, TorchProcessFailureReadsIt) {
  TempDir dir;
  const std::string path = dir / "error.json";
  ASSERT_TRUE(record_error_to(path, "std::runtime_error: boom \"quoted\"", "  #0 frame\n  #1 frame\n"));
  const std::string py =
      "import sys\n"
      "from torch.distributed.elastic.multiprocessing.errors import ProcessFailure\n"
      "f = ProcessFailure(local_rank=0, pid=123, exitcode=1, error_file=sys.argv[1])\n"
      "print(f.message['message'])\n"
      "print(f.timestamp)\n"
      "print(f.error_file_data['message']['extraInfo']['py_callstack'].splitlines()[0])\n";
  auto r = RunCommand({"/usr/bin/python3", "-c", py, path}, {}, std::chrono::seconds(60));
  if (r.exit_code != 0 && r.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP() << "Debian python3-torch not installed";
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = ctrun::testing::SplitLines(r.out);
  ASSERT_GE(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0], "std::runtime_error: boom \"quoted\"");
  const long long ts = std::stoll(lines[1]);
  EXPECT_NEAR(static_cast<double>(ts), static_cast<double>(std::time(nullptr)), 120.0);
  EXPECT_EQ(lines[2], "  #0 frame");
}

TEST(ErrorFile, TerminateHandlerRecordsUncaughtException) {
  TempDir dir;
  const std::string path = dir / "error.json";
  auto r = RunCommand({WORKER_HELPER, "throw"}, {"TORCHELASTIC_ERROR_FILE=" + path});
  EXPECT_EQ(r.exit_code, 128 + SIGABRT) << r.err;  // chained to the default handler: abort
  auto j = nlohmann::json::parse(ReadFileOr(path, "{}"));
  ASSERT_TRUE(j.contains("message")) << ReadFileOr(path);
  EXPECT_EQ(j["message"]["message"], "std::runtime_error: boom from the helper");
  const std::string stack = j["message"]["extraInfo"]["py_callstack"];
  EXPECT_NE(stack.find("#0"), std::string::npos) << stack;
}

TEST(ErrorFile, RunRecordedReturnsOneAndRecords) {
  TempDir dir;
  const std::string path = dir / "error.json";
  ::setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  int rc = run_recorded([]() -> int { throw std::invalid_argument("bad arg"); });
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  EXPECT_EQ(rc, 1);
  auto j = nlohmann::json::parse(ReadFileOr(path, "{}"));
  EXPECT_EQ(j["message"]["message"], "std::invalid_argument: bad arg");
  EXPECT_EQ(run_recorded([] { return 7; }), 7);
}

TEST(ErrorFile, NestedExceptionsAreRecordedOutermostFirst) {
  TempDir dir;
  const std::string path = dir / "error.json";
  try {
    try {
      throw std::invalid_argument("bad shape");
    } catch (...) {
      std::throw_with_nested(std::runtime_error("loading the snapshot failed"));
    }
  } catch (...) {
    ::setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
    EXPECT_TRUE(record_exception(std::current_exception()));
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
  }
  auto j = nlohmann::json::parse(ReadFileOr(path, "{}"));
  const std::string message = j["message"]["message"];
  EXPECT_EQ(message,
            "std::runtime_error: loading the snapshot failed\ncaused by: std::invalid_argument: bad shape");
}

}  // namespace
}  // namespace ctrun::worker
