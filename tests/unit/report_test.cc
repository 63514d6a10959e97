// Tests of src/report/: error-file reading and writing (including torch's own reader when the
// Debian python3-torch is installed), root-cause choice, the summary text (golden), the OOM
// counter, and the job exit code.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "helpers/test_util.h"
#include "report/error_file.h"
#include "report/oom.h"
#include "report/run_summary.h"

namespace ctrun {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;
using std::chrono::system_clock;

using ctrun::testing::TempDir;

void WriteText(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

system_clock::time_point At(int64_t epoch_seconds, int millis = 0) {
  return system_clock::time_point(seconds(epoch_seconds)) + std::chrono::milliseconds(millis);
}

// ---------------------------------------------------------------------------------------------
// ReadErrorFile

TEST(ReportErrorFileRead, MissingFileIsNoErrorFile) {
  TempDir dir;
  auto r = ReadErrorFile(dir / "nope.json");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_FALSE(r->has_value());
  auto empty_path = ReadErrorFile("");
  ASSERT_TRUE(empty_path.ok());
  EXPECT_FALSE(empty_path->has_value());
  auto under_file = ReadErrorFile("/dev/null/x.json");  // ENOTDIR
  ASSERT_TRUE(under_file.ok());
  EXPECT_FALSE(under_file->has_value());
}

TEST(ReportErrorFileRead, DirectoryIsNoErrorFile) {
  TempDir dir;
  auto r = ReadErrorFile(dir.path());
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_FALSE(r->has_value());
}

TEST(ReportErrorFileRead, DictMessageAsTorchWritesIt) {
  TempDir dir;
  WriteText(dir / "e.json",
            R"({"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": )"
            R"("Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n)"
            R"(ValueError: boom\n", "timestamp": "1700000000"}}})");
  auto r = ReadErrorFile(dir / "e.json");
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_TRUE(r->has_value());
  const ErrorFileContents& c = **r;
  EXPECT_EQ(c.message, "ValueError: boom");
  EXPECT_EQ(c.traceback,
            "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nValueError: boom\n");
  ASSERT_TRUE(c.timestamp.has_value());
  EXPECT_EQ(*c.timestamp, 1700000000);
  EXPECT_FALSE(c.error_code.has_value());
  EXPECT_TRUE(c.message_is_dict);
}

TEST(ReportErrorFileRead, DictMessageWithErrorCodeAndNoCallstack) {
  TempDir dir;
  WriteText(dir / "e.json",
            R"({"message": {"message": "RuntimeError: x", "errorCode": -9,)"
            R"( "extraInfo": {"timestamp": 1700000001}}})");
  auto r = ReadErrorFile(dir / "e.json");
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->traceback, "RuntimeError: x");  // falls back to message.message
  EXPECT_EQ((*r)->timestamp, 1700000001);
  EXPECT_EQ((*r)->error_code, -9);
}

TEST(ReportErrorFileRead, DictMessageWithNothingShowsNA) {
  TempDir dir;
  WriteText(dir / "e.json", R"({"message": {}})");
  auto r = ReadErrorFile(dir / "e.json");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->traceback, "<N/A>");
  EXPECT_FALSE((*r)->timestamp.has_value());
}

TEST(ReportErrorFileRead, StringMessageWithTopLevelTimestamp) {
  TempDir dir;
  WriteText(dir / "e.json", R"({"message": "plain failure text", "timestamp": "1700000002"})");
  auto r = ReadErrorFile(dir / "e.json");
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->message, "plain failure text");
  EXPECT_EQ((*r)->traceback, "plain failure text");
  EXPECT_EQ((*r)->timestamp, 1700000002);
  EXPECT_FALSE((*r)->message_is_dict);
}

// Found by error_file_fuzz: an empty string message left the traceback empty.
TEST(ReportErrorFileRead, EmptyStringMessageShowsNA) {
  TempDir dir;
  WriteText(dir / "e.json", R"({"message": "", "timesOOOO p": 35})");
  auto r = ReadErrorFile(dir / "e.json");
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->message, "");
  EXPECT_EQ((*r)->traceback, "<N/A>");
}

TEST(ReportErrorFileRead, StringMessageWithoutTimestamp) {
  TempDir dir;
  WriteText(dir / "e.json", R"({"message": "no time here"})");
  auto r = ReadErrorFile(dir / "e.json");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_FALSE((*r)->timestamp.has_value());
}

TEST(ReportErrorFileRead, MissingOrBadTimestampIsToleratedNotFatal) {
  // torch raises KeyError here; ctrun keeps the traceback and uses the detection time.
  TempDir dir;
  WriteText(dir / "a.json", R"({"message": {"message": "E: x", "extraInfo": {"py_callstack": "tb"}}})");
  auto a = ReadErrorFile(dir / "a.json");
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ((*a)->traceback, "tb");
  EXPECT_FALSE((*a)->timestamp.has_value());

  WriteText(dir / "b.json", R"({"message": {"message": "E: x", "extraInfo": {"timestamp": "soon"}}})");
  auto b = ReadErrorFile(dir / "b.json");
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_FALSE((*b)->timestamp.has_value());

  WriteText(dir / "c.json", R"({"message": {"extraInfo": {"timestamp": " +42 "}}})");
  auto c = ReadErrorFile(dir / "c.json");
  ASSERT_TRUE(c.ok()) << c.message();
  EXPECT_EQ((*c)->timestamp, 42);
}

TEST(ReportErrorFileRead, MalformedFilesAreErrorsWithAReason) {
  TempDir dir;
  struct Case {
    const char* text;
    const char* reason_part;
  } cases[] = {
      {R"({"message": {"message": "trunc)", "invalid JSON"},
      {"", "empty file"},
      {"   \n", "empty file"},
      {"[1, 2]", "not a JSON object"},
      {R"({"msg": "x"})", "no \"message\" field"},
      {R"({"message": 3})", "neither a string nor an object"},
  };
  for (const Case& c : cases) {
    WriteText(dir / "bad.json", c.text);
    auto r = ReadErrorFile(dir / "bad.json");
    ASSERT_FALSE(r.ok()) << "accepted: " << c.text;
    EXPECT_NE(r.message().find(c.reason_part), std::string::npos) << r.message();
  }
}

TEST(ReportErrorFileRead, HugeFileIsRejectedWithoutReadingItAll) {
  TempDir dir;
  std::string big = R"({"message": ")" + std::string(2 << 20, 'x') + R"("})";
  WriteText(dir / "big.json", big);
  auto r = ReadErrorFile(dir / "big.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("too large"), std::string::npos) << r.message();

  // Under a smaller cap the same rule applies; at or below the cap the file is parsed.
  WriteText(dir / "small.json", R"({"message": "ok"})");
  EXPECT_FALSE(ReadErrorFile(dir / "small.json", 5).ok());
  EXPECT_TRUE(ReadErrorFile(dir / "small.json", 17).ok());
}

TEST(ReportErrorFileRead, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads mode-000 files";
  TempDir dir;
  WriteText(dir / "e.json", R"({"message": "x"})");
  ::chmod((dir / "e.json").c_str(), 0);
  auto r = ReadErrorFile(dir / "e.json");
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.message().find("cannot open"), std::string::npos) << r.message();
}

// ---------------------------------------------------------------------------------------------
// Writers

TEST(ReportErrorFileWrite, RecordRoundTripsAndHasTorchShape) {
  TempDir dir;
  ErrorFileRecord rec;
  rec.message = "Signal 9 (SIGKILL) received by PID 12";
  rec.py_callstack = "line one\nline \"two\"\n";
  rec.timestamp = 1700000003;
  rec.error_code = -9;
  ASSERT_TRUE(WriteErrorFile(dir / "out.json", rec).ok());

  auto j = nlohmann::json::parse(ReadText(dir / "out.json"));
  EXPECT_EQ(j["message"]["message"], rec.message);
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], rec.py_callstack);
  EXPECT_EQ(j["message"]["extraInfo"]["timestamp"], "1700000003");  // a string, as torch writes it
  EXPECT_EQ(j["message"]["errorCode"], -9);

  auto r = ReadErrorFile(dir / "out.json");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->message, rec.message);
  EXPECT_EQ((*r)->traceback, rec.py_callstack);
  EXPECT_EQ((*r)->timestamp, 1700000003);
  EXPECT_EQ((*r)->error_code, -9);

  // No temp files are left behind, and the file is readable by others (like torch's open("w")).
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "out.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST(ReportErrorFileWrite, OverwritesAtomically) {
  TempDir dir;
  WriteText(dir / "out.json", "garbage that is not json");
  ErrorFileRecord rec;
  rec.message = "m";
  rec.timestamp = 1;
  ASSERT_TRUE(WriteErrorFile(dir / "out.json", rec).ok());
  auto r = ReadErrorFile(dir / "out.json");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ((*r)->traceback, "m");  // empty callstack -> the message is used
}

TEST(ReportErrorFileWrite, FailsCleanlyInAMissingDirectory) {
  TempDir dir;
  Status s = WriteErrorFile(dir / "no/such/dir/out.json", ErrorFileRecord{"m", "", 1, {}});
  EXPECT_FALSE(s.ok());
}

TEST(ReportErrorFileWrite, CopySetsErrorCodeOnDictMessageOnly) {
  TempDir dir;
  WriteText(dir / "worker.json",
            R"({"message": {"message": "E: x", "extraInfo": {"py_callstack": "tb", "timestamp": "5"}},)"
            R"( "extra": [1, 2]})");
  auto src = ReadErrorFile(dir / "worker.json");
  ASSERT_TRUE(src.ok() && src->has_value());
  ASSERT_TRUE(CopyErrorFile(dir / "agent.json", **src, 3).ok());
  auto j = nlohmann::json::parse(ReadText(dir / "agent.json"));
  EXPECT_EQ(j["message"]["errorCode"], 3);
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], "tb");
  EXPECT_EQ(j["extra"], nlohmann::json::array({1, 2}));  // everything else is copied as is

  WriteText(dir / "worker2.json", R"({"message": "plain", "timestamp": 7})");
  auto src2 = ReadErrorFile(dir / "worker2.json");
  ASSERT_TRUE(src2.ok() && src2->has_value());
  ASSERT_TRUE(CopyErrorFile(dir / "agent2.json", **src2, 3).ok());
  auto j2 = nlohmann::json::parse(ReadText(dir / "agent2.json"));
  EXPECT_EQ(j2["message"], "plain");
  EXPECT_FALSE(j2.contains("errorCode"));
}

// Runs Debian torch's own reader on path; returns its stdout, or nullopt when torch is missing.
std::optional<std::string> RunTorchReader(const std::string& path, std::string* skip_reason) {
  if (::access("/usr/bin/python3", X_OK) != 0) {
    *skip_reason = "/usr/bin/python3 not installed";
    return std::nullopt;
  }
  std::string cmd =
      "/usr/bin/python3 -c \"from torch.distributed.elastic.multiprocessing.errors import "
      "ProcessFailure; f=ProcessFailure(local_rank=0,pid=1,exitcode=1,error_file='" +
      path + "'); print(repr(f.message)); print(f.timestamp)\" 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return std::string("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0 && out.find("No module named 'torch") != std::string::npos) {
    *skip_reason = "/usr/bin/python3 cannot import torch (python3-torch not installed)";
    return std::nullopt;
  }
  if (rc != 0) out = "EXIT " + std::to_string(rc) + ": " + out;
  return out;
}

TEST(ReportErrorFileWrite, TorchsOwnReaderAcceptsOurFiles) {
  TempDir dir;
  ErrorFileRecord rec;
  rec.message = "Signal 9 (SIGKILL) received by PID 1236";
  rec.py_callstack = "last 1 lines of stderr:\nKilled\n";
  rec.timestamp = 1700000004;
  rec.error_code = -9;
  ASSERT_TRUE(WriteErrorFile(dir / "agent.json", rec).ok());
  std::string skip;
  auto out = RunTorchReader(dir / "agent.json", &skip);
  if (!out) GTEST_SKIP() << skip;
  EXPECT_EQ(out->rfind("EXIT", 0), std::string::npos) << *out;
  EXPECT_NE(out->find("'message': 'Signal 9 (SIGKILL) received by PID 1236'"), std::string::npos) << *out;
  EXPECT_NE(out->find("'errorCode': -9"), std::string::npos) << *out;
  EXPECT_NE(out->find("\n1700000004\n"), std::string::npos) << *out;

  // And the copy of a worker's file made for the parent.
  WriteText(dir / "worker.json",
            R"({"message": {"message": "E: x", "extraInfo": {"py_callstack": "tb", "timestamp": "6"}}})");
  auto src = ReadErrorFile(dir / "worker.json");
  ASSERT_TRUE(src.ok() && src->has_value());
  ASSERT_TRUE(CopyErrorFile(dir / "agent2.json", **src, 1).ok());
  auto out2 = RunTorchReader(dir / "agent2.json", &skip);
  ASSERT_TRUE(out2.has_value());
  EXPECT_EQ(out2->rfind("EXIT", 0), std::string::npos) << *out2;
  EXPECT_NE(out2->find("'errorCode': 1"), std::string::npos) << *out2;
  EXPECT_NE(out2->find("\n6\n"), std::string::npos) << *out2;
}

// ---------------------------------------------------------------------------------------------
// Root cause and exit code

WorkerFailure Failure(int rank, ExitStatus status, system_clock::time_point t, bool stopped = false) {
  WorkerFailure f;
  f.global_rank = rank;
  f.local_rank = rank;
  f.role_rank = rank;
  f.pid = 1000 + rank;
  f.status = status;
  f.time = t;
  f.stopped_by_ctrun = stopped;
  return f;
}

TEST(ReportRootCause, EarliestFailureNotStoppedByCtrun) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(15), At(100, 0), /*stopped=*/true),
      Failure(1, ExitStatus::Exited(3), At(100, 500)),
      Failure(2, ExitStatus::Signaled(9), At(100, 200)),
      Failure(3, ExitStatus::Exited(1), At(101)),
  };
  EXPECT_EQ(ChooseRootCause(fs), 2u);
  EXPECT_EQ(JobExitCode(fs), 128 + 9);
}

TEST(ReportRootCause, ErrorFileTimestampWinsOverDetectionTime) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Exited(1), At(200)),  // detected first
      Failure(1, ExitStatus::Exited(7), At(205)),  // but its error file says it failed at 150
  };
  fs[1].error_data = ErrorFileContents{};
  fs[1].error_data->timestamp = 150;
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  EXPECT_EQ(JobExitCode(fs), 7);
  // A file without a timestamp falls back to the detection time.
  fs[1].error_data->timestamp.reset();
  EXPECT_EQ(ChooseRootCause(fs), 0u);
  EXPECT_EQ(JobExitCode(fs), 1);
}

// A crashing rank closes its sockets while unwinding, before its error file is written: the peer
// that lost it may write the older file. The rank that did not just lose a peer is the cause.
TEST(ReportRootCause, ARankThatLostItsPeerIsNotTheRootCause) {
  std::vector<WorkerFailure> fs = {
      Failure(1, ExitStatus::Exited(1), At(300)),
      Failure(2, ExitStatus::Signaled(SIGABRT), At(299)),
  };
  fs[0].error_data = ErrorFileContents{};
  fs[0].error_data->message = "RuntimeError: injected failure at step 14 on rank 1";
  fs[0].error_data->timestamp = 101;
  fs[1].error_data = ErrorFileContents{};
  fs[1].error_data->message = "RuntimeError: [../gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4";
  fs[1].error_data->timestamp = 100;
  EXPECT_EQ(ChooseRootCause(fs), 0u);
  EXPECT_EQ(JobExitCode(fs), 1);
  // When every failure lost a peer, time decides as before.
  fs[0].error_data->message = "Connection reset by peer";
  EXPECT_EQ(ChooseRootCause(fs), 1u);
}

// A C++ rank that does not ignore SIGPIPE dies of it when it writes to the crashed rank's closed
// socket, often before the crashed rank's own exit is seen.
TEST(ReportRootCause, ARankKilledBySigpipeLostItsPeer) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(SIGPIPE), At(300)),
      Failure(2, ExitStatus::Signaled(SIGABRT), At(300, 5)),
  };
  EXPECT_TRUE(LostAPeer(fs[0]));
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  EXPECT_EQ(JobExitCode(fs), 128 + SIGABRT);
}

// A script without @record writes no error file: its uncaught exception's line, the last of its
// stderr, says that it lost its peer. Only that last line counts: a "Broken pipe" earlier in the
// output (a warning, a retried download) is not the failure.
TEST(ReportRootCause, WithoutAnErrorFileTheLastStderrLineTellsALostPeer) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Exited(1), At(300)),
      Failure(2, ExitStatus::Exited(1), At(300, 5)),
  };
  fs[0].stderr_tail = "Traceback (most recent call last):\n  File \"train.py\", line 9\nRuntimeError: "
                      "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
                      "[127.0.0.1]:41234\n\n";
  fs[1].stderr_tail = "warning: Broken pipe, retrying\nTraceback (most recent call last):\nValueError: bad batch\n";
  EXPECT_TRUE(LostAPeer(fs[0]));
  EXPECT_FALSE(LostAPeer(fs[1]));
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  // torch appends the Python stack to a C++ error (a DDP comm hook's): "At:" and indented frames.
  fs[0].stderr_tail = "Traceback (most recent call last):\n  File \"train.py\", line 286, in <module>\n"
                      "RuntimeError: [pair.cc:598] Connection closed by peer [127.0.0.1]:39813\n"
                      "Exception raised from recvBytes at ../gloo/pair.cc:598\nAt:\n"
                      "  /usr/lib/python3/dist-packages/torch/nn/parallel/distributed.py(1040): forward\n"
                      "  train.py(286): <module>\n";
  EXPECT_TRUE(LostAPeer(fs[0]));
}

// Multi-node: the job's agreed root cause is on another node. This node's rank that lost its peer
// there (it failed before the stop came) is listed as such, never as the root cause.
TEST(ReportSummary, ARemoteRootCauseIsTheRootCauseAndALocalLostPeerIsNot) {
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Signaled(SIGPIPE), At(300))};
  SummaryOptions o;
  o.remote_root_cause = "node 2 (host-c): rank 2 exited with code 2";
  const std::string out = FormatFailureSummary("w", fs, "h", o);
  EXPECT_NE(out.find("Root Cause (first observed failure):\n  on another node: node 2 (host-c): rank 2 exited with code 2"),
            std::string::npos) << out;
  EXPECT_NE(out.find("cause     : lost a peer (a consequence of another rank's failure)"), std::string::npos) << out;
}

// A single-node job whose only failure reads as a lost peer (a worker's own connection was reset,
// or its peer exited 0 early): no other rank failed, so that is not what happened. Another rank's
// failure, or a job across nodes, keeps the label.
TEST(ReportSummary, ALostConnectionWithNoOtherFailureHereIsTheRanksOwnFailureOnOneNode) {
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(1), At(300)), Failure(1, ExitStatus::Signaled(SIGTERM), At(301))};
  fs[0].stderr_tail = "Traceback (most recent call last):\nConnectionResetError: [Errno 104] Connection reset by peer\n";
  fs[1].stopped_by_ctrun = true;
  ASSERT_TRUE(LostAPeer(fs[0]));
  SummaryOptions o;
  o.single_node = true;
  EXPECT_NE(FormatFailureSummary("w", fs, "h", o).find("cause     : failed on its own (it lost a connection, but no other rank failed)"),
            std::string::npos);
  o.single_node = false;
  EXPECT_NE(FormatFailureSummary("w", fs, "h", o).find("cause     : lost a peer (a consequence of another rank's failure)"),
            std::string::npos);
  o.single_node = true;
  fs[1] = Failure(1, ExitStatus::Exited(2), At(299));
  fs[1].stderr_tail = "ValueError: bad batch\n";
  EXPECT_NE(FormatFailureSummary("w", fs, "h", o).find("cause     : lost a peer (a consequence of another rank's failure)"),
            std::string::npos);
}

// Rank 1 raised and wrote its error file, then spent a while in interpreter shutdown; rank 0 lost
// its peer, exited first, and ctrun's SIGTERM ended rank 1 while it was still exiting. Rank 1's
// file predates the signal: it failed on its own, and is the root cause.
TEST(ReportRootCause, ARankWhoseErrorFilePredatesTheStopSignalFailedOnItsOwn) {
  TempDir tmp;
  auto write = [&](const std::string& name, const std::string& message, int64_t ns) {
    std::string path = tmp.path() + "/" + name;
    std::ofstream(path) << R"({"message": {"message": ")" << message
                        << R"(", "extraInfo": {"py_callstack": "c", "timestamp": ")" << ns / 1000000000
                        << R"(", "ctrun_timestamp_ns": ")" << ns << R"("}}})";
    return path;
  };
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Exited(1), At(300)),
      Failure(1, ExitStatus::Signaled(SIGTERM), At(300, 600), /*stopped=*/true),
  };
  fs[0].error_file = write("r0.json", "RuntimeError: Connection closed by peer [127.0.0.1]:4", 299'900'000'000LL);
  fs[1].error_file = write("r1.json", "RuntimeError: injected failure", 299'800'000'000LL);
  fs[1].stop_sent = At(300, 100);
  LoadErrorFiles(&fs);
  EXPECT_FALSE(StoppedByCtrun(fs[1]));
  EXPECT_TRUE(FailedBeforeStop(fs[1]));
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  EXPECT_EQ(JobExitCode(fs), 1);  // its exception's exit, not ctrun's 128+SIGTERM
  EXPECT_NE(FormatFailureSummary("w", fs, "h", {}).find("predates ctrun's stop signal"), std::string::npos);

  // A file written after the signal (a handler reacting to it) stays ctrun's doing.
  fs[1].error_file = write("r1.json", "SystemExit: terminated", 300'200'000'000LL);
  LoadErrorFiles(&fs);
  EXPECT_TRUE(StoppedByCtrun(fs[1]));
  EXPECT_EQ(ChooseRootCause(fs), 0u);
  // So does one that only lost a peer, and one without a file.
  fs[1].error_file = write("r1.json", "Connection reset by peer", 299'800'000'000LL);
  LoadErrorFiles(&fs);
  EXPECT_TRUE(StoppedByCtrun(fs[1]));
  fs[1].error_file = tmp.path() + "/missing.json";
  LoadErrorFiles(&fs);
  EXPECT_TRUE(StoppedByCtrun(fs[1]));
}

TEST(ReportRootCause, NanosecondErrorFileTimeBreaksSameSecondTies) {
  // Rank 2 threw first; rank 1 died of "connection closed" 3 ms later in the same second.
  std::vector<WorkerFailure> fs = {
      Failure(1, ExitStatus::Exited(1), At(300)),
      Failure(2, ExitStatus::Exited(1), At(300, 100)),
  };
  for (auto& f : fs) {
    f.error_data = ErrorFileContents{};
    f.error_data->timestamp = 299;
  }
  fs[0].error_data->timestamp_ns = 299'004'000'000LL;
  fs[1].error_data->timestamp_ns = 299'001'000'000LL;
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  // The reader takes it from extraInfo.ctrun_timestamp_ns.
  TempDir tmp;
  std::string path = tmp.path() + "/error.json";
  {
    std::ofstream f(path);
    f << R"({"message": {"message": "m", "extraInfo": {"py_callstack": "c", "timestamp": "299", )"
      << R"("ctrun_timestamp_ns": "299001000000"}}})";
  }
  auto read = ReadErrorFile(path);
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->timestamp_ns, 299'001'000'000LL);
}

TEST(ReportRootCause, ErrorFileMtimeOrdersTorchsWholeSecondTimestamps) {
  // torch's @record writes whole seconds: rank 2 crashed first, rank 1 died of its closed
  // connection later in the same second. The files' modification times tell them apart.
  std::vector<WorkerFailure> fs = {
      Failure(1, ExitStatus::Exited(1), At(300)),
      Failure(2, ExitStatus::Exited(1), At(300, 100)),
  };
  for (auto& f : fs) {
    f.error_data = ErrorFileContents{};
    f.error_data->timestamp = 299;
  }
  fs[0].error_file_mtime_ns = 299'400'000'000LL;
  fs[1].error_file_mtime_ns = 299'100'000'000LL;
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  // An mtime outside the timestamp's second (a file copied or touched later) is not trusted:
  // whole seconds again, and the tie goes to the lowest rank.
  fs[0].error_file_mtime_ns = 305'000'000'000LL;
  fs[1].error_file_mtime_ns = 305'000'000'000LL;
  EXPECT_EQ(ChooseRootCause(fs), 0u);
  // LoadErrorFile reads it with the file.
  TempDir tmp;
  WorkerFailure f = Failure(0, ExitStatus::Exited(1), At(300));
  f.error_file = tmp.path() + "/error.json";
  std::ofstream(f.error_file) << R"({"message": "boom", "timestamp": "299"})";
  LoadErrorFile(&f);
  EXPECT_TRUE(f.error_data.has_value());
  EXPECT_TRUE(f.error_file_mtime_ns.has_value());
}

TEST(ReportRootCause, TiesGoToTheLowestRank) {
  std::vector<WorkerFailure> fs = {
      Failure(3, ExitStatus::Exited(4), At(100)),
      Failure(1, ExitStatus::Exited(5), At(100)),
      Failure(2, ExitStatus::Exited(6), At(100)),
  };
  EXPECT_EQ(ChooseRootCause(fs), 1u);
  EXPECT_EQ(JobExitCode(fs), 5);
}

TEST(ReportRootCause, NoneWhenAllStoppedByCtrunOrEmpty) {
  EXPECT_FALSE(ChooseRootCause({}).has_value());
  EXPECT_EQ(JobExitCode({}), 0);
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(15), At(100), true),
      Failure(1, ExitStatus::Signaled(9), At(100), true),
  };
  EXPECT_FALSE(ChooseRootCause(fs).has_value());
  EXPECT_EQ(JobExitCode(fs), 1);
}

TEST(ReportJobExitCode, ShellConvention) {
  EXPECT_EQ(JobExitCode({Failure(0, ExitStatus::Exited(42), At(1))}), 42);
  EXPECT_EQ(JobExitCode({Failure(0, ExitStatus::Signaled(11, true), At(1))}), 139);
  EXPECT_EQ(JobExitCode({Failure(0, ExitStatus::Exited(255), At(1))}), 255);
}

// ---------------------------------------------------------------------------------------------
// Summary text (golden)

SummaryOptions UtcOptions() {
  SummaryOptions o;
  o.utc = true;
  return o;
}

TEST(ReportSummary, TwoFailuresWithErrorFileGolden) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Exited(1), At(1700000000, 300)),
      Failure(1, ExitStatus::Signaled(15), At(1700000001, 100), /*stopped=*/true),
  };
  fs[0].error_file = "/tmp/torchelastic_x/attempt_0/0/error.json";
  fs[0].error_data = ErrorFileContents{};
  fs[0].error_data->message = "ValueError: boom";
  fs[0].error_data->traceback =
      "Traceback (most recent call last):\n  File \"train.py\", line 9, in main\n"
      "    raise ValueError(\"boom\")\nValueError: boom\n";
  fs[0].error_data->timestamp = 1699999999;
  fs[1].stderr_tail = "collateral noise\n";  // not shown: stopped by ctrun
  SummaryOptions o;
  o.utc = true;
  const std::string expected =
      "========================================================\n"
      "train.py FAILED\n"
      "--------------------------------------------------------\n"
      "Failures:\n"
      "  <NO_OTHER_FAILURES>\n"
      "--------------------------------------------------------\n"
      "Root Cause (first observed failure):\n"
      "[0]:\n"
      "  time      : 2023-11-14_22:13:19\n"
      "  host      : node1.example.com\n"
      "  rank      : 0 (local_rank: 0)\n"
      "  exitcode  : 1 (pid: 1000)\n"
      "  error_file: /tmp/torchelastic_x/attempt_0/0/error.json\n"
      "  cause     : failed on its own\n"
      "  traceback : Traceback (most recent call last):\n"
      "    File \"train.py\", line 9, in main\n"
      "      raise ValueError(\"boom\")\n"
      "  ValueError: boom\n"
      "--------------------------------------------------------\n"
      "Stopped by ctrun (not failures of their own):\n"
      "[1]:\n"
      "  time      : 2023-11-14_22:13:21\n"
      "  host      : node1.example.com\n"
      "  rank      : 1 (local_rank: 1)\n"
      "  exitcode  : -15 (SIGTERM) (pid: 1001)\n"
      "  error_file: <N/A>\n"
      "  cause     : stopped by ctrun after rank 0 failed\n"
      "  traceback : Signal 15 (SIGTERM) received by PID 1001\n"
      "========================================================\n";
  EXPECT_EQ(FormatFailureSummary("train.py", fs, "node1.example.com", o), expected);
}

TEST(ReportSummary, NarrowBlocksGiveANarrowBorderLikeTorch) {
  // torch: width = min(60, max(len(title), widest block line)); here the "time" line, 33.
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(2), At(0))};
  fs[0].error_data = ErrorFileContents{};
  fs[0].error_data->traceback = "x";
  fs[0].error_data->timestamp = 0;
  SummaryOptions o;
  o.utc = true;
  const std::string expected =
      "=================================\n"
      "a FAILED\n"
      "---------------------------------\n"
      "Failures:\n"
      "  <NO_OTHER_FAILURES>\n"
      "---------------------------------\n"
      "Root Cause (first observed failure):\n"
      "[0]:\n"
      "  time      : 1970-01-01_00:00:00\n"
      "  host      : h\n"
      "  rank      : 0 (local_rank: 0)\n"
      "  exitcode  : 2 (pid: 1000)\n"
      "  error_file: \n"
      "  cause     : failed on its own\n"
      "  traceback : x\n"
      "=================================\n";
  EXPECT_EQ(FormatFailureSummary("a", fs, "h", o), expected);
}

TEST(ReportSummary, NoErrorFileShowsStderrTailAndHintOnce) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Exited(3), At(1700000000)),
      Failure(1, ExitStatus::Exited(4), At(1700000005)),
  };
  fs[0].stderr_tail = "a\nb\nc\nd\n";
  fs[1].stderr_tail = "x1\nx2\nx3\n";
  SummaryOptions o;
  o.utc = true;
  o.root_stderr_lines = 3;
  o.other_stderr_lines = 1;
  std::string s = FormatFailureSummary("./train", fs, "h", o);
  EXPECT_NE(s.find("  traceback : <N/A> (no error file); last 3 lines of stderr:\n    b\n    c\n    d\n"
                   "  hint      : To enable traceback see: "
                   "https://pytorch.org/docs/stable/elastic/errors.html\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("  traceback : <N/A> (no error file); last line of stderr:\n    x3\n"), std::string::npos)
      << s;
  EXPECT_EQ(s.find("    a\n"), std::string::npos) << s;
  size_t first = s.find("To enable traceback");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(s.find("To enable traceback", first + 1), std::string::npos) << s;
  EXPECT_NE(s.find("  cause     : failed on its own\n"), std::string::npos);
}

TEST(ReportSummary, UnreadableErrorFileIsShownAndTreatedAsNone) {
  TempDir dir;
  WriteText(dir / "error.json", "{not json");
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(1), At(1700000000))};
  fs[0].error_file = dir / "error.json";
  fs[0].stderr_tail = "oops\n";
  LoadErrorFiles(&fs);
  EXPECT_FALSE(fs[0].error_data.has_value());
  ASSERT_FALSE(fs[0].error_file_problem.empty());
  std::string s = FormatFailureSummary("t", fs, "h", SummaryOptions{});
  EXPECT_NE(s.find("  error_file: " + (dir / "error.json") + " (unreadable: invalid JSON: "),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("last line of stderr:\n    oops\n"), std::string::npos) << s;
}

TEST(ReportSummary, LoadErrorFileReadsValidFilesAndMissingOnes) {
  TempDir dir;
  WriteText(dir / "e.json", R"({"message": {"message": "E", "extraInfo": {"py_callstack": "TB",)"
                            R"( "timestamp": "1700000000"}}})");
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(1), At(1700000009)),
                                   Failure(1, ExitStatus::Exited(1), At(1700000001))};
  fs[0].error_file = dir / "e.json";
  fs[1].error_file = dir / "missing.json";
  LoadErrorFiles(&fs);
  ASSERT_TRUE(fs[0].error_data.has_value());
  EXPECT_FALSE(fs[1].error_data.has_value());
  EXPECT_TRUE(fs[1].error_file_problem.empty());
  EXPECT_EQ(ChooseRootCause(fs), 0u);  // error-file timestamp 1700000000 < detection 1700000001
  std::string s = FormatFailureSummary("t", fs, "h", UtcOptions());
  EXPECT_NE(s.find("  error_file: <N/A>\n"), std::string::npos) << s;  // torch shows <N/A>, not the path
  EXPECT_NE(s.find("  traceback : TB\n"), std::string::npos) << s;
}

std::vector<WorkerFailure> OomJob() {
  // 4 ranks; rank 2 SIGKILLed by the OOM killer; the others stopped by ctrun (one needed SIGKILL).
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(15), At(1700000000, 420), true),
      Failure(1, ExitStatus::Signaled(15), At(1700000000, 430), true),
      Failure(2, ExitStatus::Signaled(9), At(1700000000, 400)),
      Failure(3, ExitStatus::Signaled(9), At(1700000030, 450), true),
  };
  fs[2].oom_killed = true;
  fs[2].stderr_tail =
      "epoch 3 step 1200 loss 0.412\nepoch 3 step 1300 loss 0.398\nallocating activations 48 GiB\n";
  return fs;
}

SummaryOptions OomOptions() {
  SummaryOptions o;
  o.utc = true;
  o.oom_before = OomKillSample{0, "cgroup memory.events"};
  o.oom_after = OomKillSample{1, "cgroup memory.events"};
  return o;
}

TEST(ReportSummary, OomVictimAmongRanksStoppedByCtrunGolden) {
  const std::string expected =
      "============================================================\n"
      "train.py FAILED\n"
      "------------------------------------------------------------\n"
      "Failures:\n"
      "  <NO_OTHER_FAILURES>\n"
      "------------------------------------------------------------\n"
      "Root Cause (first observed failure):\n"
      "[0]:\n"
      "  time      : 2023-11-14_22:13:20\n"
      "  host      : node1\n"
      "  rank      : 2 (local_rank: 2)\n"
      "  exitcode  : -9 (SIGKILL) (pid: 1002)\n"
      "  error_file: <N/A>\n"
      "  cause     : failed on its own\n"
      "  note      : likely killed by the kernel OOM killer: cgroup memory.events oom_kill went "
      "from 0 to 1\n"
      "  traceback : Signal 9 (SIGKILL) received by PID 1002; last 3 lines of stderr:\n"
      "    epoch 3 step 1200 loss 0.412\n"
      "    epoch 3 step 1300 loss 0.398\n"
      "    allocating activations 48 GiB\n"
      "------------------------------------------------------------\n"
      "Stopped by ctrun (not failures of their own):\n"
      "[1]:\n"
      "  time      : 2023-11-14_22:13:20\n"
      "  host      : node1\n"
      "  rank      : 0 (local_rank: 0)\n"
      "  exitcode  : -15 (SIGTERM) (pid: 1000)\n"
      "  error_file: <N/A>\n"
      "  cause     : stopped by ctrun after rank 2 failed\n"
      "  traceback : Signal 15 (SIGTERM) received by PID 1000\n"
      "[2]:\n"
      "  time      : 2023-11-14_22:13:20\n"
      "  host      : node1\n"
      "  rank      : 1 (local_rank: 1)\n"
      "  exitcode  : -15 (SIGTERM) (pid: 1001)\n"
      "  error_file: <N/A>\n"
      "  cause     : stopped by ctrun after rank 2 failed\n"
      "  traceback : Signal 15 (SIGTERM) received by PID 1001\n"
      "[3]:\n"
      "  time      : 2023-11-14_22:13:50\n"
      "  host      : node1\n"
      "  rank      : 3 (local_rank: 3)\n"
      "  exitcode  : -9 (SIGKILL) (pid: 1003)\n"
      "  error_file: <N/A>\n"
      "  cause     : stopped by ctrun after rank 2 failed\n"
      "  traceback : Signal 9 (SIGKILL) received by PID 1003\n"
      "============================================================\n";
  std::vector<WorkerFailure> fs = OomJob();
  std::string s = FormatFailureSummary("train.py", fs, "node1", OomOptions());
  EXPECT_EQ(s, expected);
  EXPECT_EQ(JobExitCode(fs), 137);
  if (std::getenv("CTRUN_PRINT_SUMMARY")) std::fputs(s.c_str(), stdout);
}

TEST(ReportSummary, EveryWorkerStoppedByCtrun) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(15), At(1700000000), true),
      Failure(1, ExitStatus::Signaled(15), At(1700000000), true),
  };
  SummaryOptions o;
  o.utc = true;
  o.stop_reason = "ctrun received signal 15 (SIGTERM)";
  std::string s = FormatFailureSummary("./train", fs, "h", o);
  EXPECT_NE(s.find("Failures:\n  <NO_OTHER_FAILURES>\n"), std::string::npos) << s;
  EXPECT_NE(s.find("Stopped by ctrun (not failures of their own):\n[0]:\n"), std::string::npos) << s;
  EXPECT_NE(s.find("[1]:\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  cause     : stopped by ctrun (ctrun received signal 15 (SIGTERM))\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("Root Cause (first observed failure):\n  <NO_ROOT_CAUSE>: every failed worker was "
                   "stopped by ctrun; ctrun received signal 15 (SIGTERM)\n-----"),
            std::string::npos)
      << s;
  EXPECT_EQ(FormatFailureSummary("x", {}, "h", o), "");
}

TEST(ReportSummary, CoreDumpAndOtherFailuresOnTheirOwn) {
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(11, true), At(1700000000)),
      Failure(1, ExitStatus::Exited(2), At(1700000002)),
  };
  std::string s = FormatFailureSummary("t", fs, "h", UtcOptions());
  EXPECT_NE(s.find("  exitcode  : -11 (SIGSEGV, core dumped) (pid: 1000)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("[1]:\n"), std::string::npos);
  // Rank 1 failed on its own too, it is just not first.
  EXPECT_EQ(s.find("stopped by ctrun"), std::string::npos) << s;
  // The hint is for exit codes, not signals: the root cause here is a signal.
  EXPECT_EQ(s.find("To enable traceback"), std::string::npos) << s;
}

TEST(ReportSummary, IndicesCountOwnFailuresFirstLikeTorch) {
  // Rank 0 stopped by ctrun, ranks 1 and 2 failed on their own (2 first): torch numbers the
  // failures it collected, [0] rank 1 and [1] rank 2; the stopped rank follows as [2].
  std::vector<WorkerFailure> fs = {
      Failure(0, ExitStatus::Signaled(15), At(1700000003), true),
      Failure(1, ExitStatus::Exited(1), At(1700000002)),
      Failure(2, ExitStatus::Exited(1), At(1700000001)),
  };
  std::string s = FormatFailureSummary("t", fs, "h", UtcOptions());
  const size_t failures = s.find("Failures:\n[0]:\n");
  const size_t root = s.find("Root Cause (first observed failure):\n[1]:\n");
  const size_t stopped = s.find("Stopped by ctrun (not failures of their own):\n[2]:\n");
  ASSERT_NE(failures, std::string::npos) << s;
  ASSERT_NE(root, std::string::npos) << s;
  ASSERT_NE(stopped, std::string::npos) << s;
  EXPECT_NE(s.find("rank      : 1 (local_rank: 1)"), std::string::npos);
  EXPECT_LT(s.find("rank      : 1 (local_rank: 1)"), root) << s;
  EXPECT_GT(s.find("rank      : 0 (local_rank: 0)"), stopped) << s;
}

TEST(ReportSummary, MissingTorchNamesTheInterpreter) {
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(1), At(1700000000))};
  fs[0].stderr_tail = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'torch'\n";
  SummaryOptions o = UtcOptions();
  EXPECT_EQ(FormatFailureSummary("t.py", fs, "h", o).find("note"), std::string::npos);  // not under Python
  o.python_interpreter = "/home/u/.pyenv/shims/python3";
  EXPECT_NE(FormatFailureSummary("t.py", fs, "h", o)
                .find("  note      : the worker ran under /home/u/.pyenv/shims/python3, which cannot import "
                      "torch; choose an interpreter that has it with PYTHON_EXEC, e.g. "
                      "PYTHON_EXEC=/usr/bin/python3\n"),
            std::string::npos);
  o.python_interpreter = "/usr/bin/python3";
  EXPECT_NE(FormatFailureSummary("t.py", fs, "h", o).find("PYTHON_EXEC=/path/to/python3 (or install torch for it)"),
            std::string::npos);
  fs[0].stderr_tail = "ModuleNotFoundError: No module named 'torchvision'\n";
  EXPECT_EQ(FormatFailureSummary("t.py", fs, "h", o).find("note"), std::string::npos);
}

// A script run by its #! line: PYTHON_EXEC does not choose its interpreter, the line does.
TEST(ReportSummary, MissingTorchUnderAShebangSaysTheLineChoseTheInterpreter) {
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(1), At(1700000000))};
  fs[0].stderr_tail = "ModuleNotFoundError: No module named 'torch'\n";
  SummaryOptions o = UtcOptions();
  o.python_interpreter = "/home/u/venv/bin/python3";
  o.python_from = InterpreterFrom::kShebang;
  const std::string text = FormatFailureSummary("train", fs, "h", o);
  EXPECT_NE(text.find("  note      : the worker ran under /home/u/venv/bin/python3, which its #! line chose and "
                      "which cannot import torch; change that line, or run the script under an interpreter that "
                      "has torch (ctrun ... /usr/bin/python3 SCRIPT)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("PYTHON_EXEC"), std::string::npos) << text;
}

// A script that hosts its own TCPStore at MASTER_PORT (torch 1.13 let rank 0 do it) finds ctrun's
// agent store there: the summary names the port and --no-agent-store.
TEST(ReportSummary, AWorkerThatCannotBindTheAgentStoresPortIsToldWhy) {
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Exited(1), At(1700000000))};
  fs[0].stderr_tail =
      "RuntimeError: The server socket has failed to listen on any local network address. The server socket has "
      "failed to bind to [::]:29511 (errno: 98 - Address already in use).\n";
  SummaryOptions o = UtcOptions();
  EXPECT_EQ(FormatFailureSummary("t.py", fs, "h", o).find("note"), std::string::npos);  // no agent store
  o.agent_store_port = 29511;
  const std::string text = FormatFailureSummary("t.py", fs, "h", o);
  EXPECT_NE(text.find("  note      : MASTER_PORT=29511 is ctrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("--no-agent-store"), std::string::npos) << text;
  fs[0].stderr_tail = "ValueError: bad\n";
  EXPECT_EQ(FormatFailureSummary("t.py", fs, "h", o).find("note"), std::string::npos);
  fs[0].stderr_tail = "failed to bind to [::]:8080 (errno: 98 - Address already in use)\n";  // another port
  EXPECT_EQ(FormatFailureSummary("t.py", fs, "h", o).find("note"), std::string::npos);
}

TEST(ReportAgentErrorFile, CopiesTheRootCauseFileWithItsExitCode) {
  TempDir dir;
  WriteText(dir / "w1.json", R"({"message": {"message": "E: x", "extraInfo": {"py_callstack": "TB",)"
                             R"( "timestamp": "1700000000"}}})");
  std::vector<WorkerFailure> fs = {Failure(0, ExitStatus::Signaled(15), At(1700000001), true),
                                   Failure(1, ExitStatus::Exited(3), At(1700000001))};
  fs[1].error_file = dir / "w1.json";
  LoadErrorFiles(&fs);
  ASSERT_TRUE(WriteAgentErrorFile(dir / "agent.json", fs).ok());
  auto j = nlohmann::json::parse(ReadText(dir / "agent.json"));
  EXPECT_EQ(j["message"]["errorCode"], 3);
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], "TB");
  EXPECT_TRUE(WriteAgentErrorFile("", fs).ok());  // no path: nothing to do
}

TEST(ReportAgentErrorFile, DescribesARootCauseWithoutAnErrorFile) {
  TempDir dir;
  std::vector<WorkerFailure> fs = OomJob();
  ASSERT_TRUE(WriteAgentErrorFile(dir / "agent.json", fs, OomOptions()).ok());
  auto r = ReadErrorFile(dir / "agent.json");
  ASSERT_TRUE(r.ok() && r->has_value()) << r.message();
  EXPECT_EQ((*r)->message, "Signal 9 (SIGKILL) received by PID 1002");
  EXPECT_EQ((*r)->error_code, -9);
  EXPECT_EQ((*r)->timestamp, 1700000000);
  EXPECT_NE((*r)->traceback.find("oom_kill went from 0 to 1"), std::string::npos) << (*r)->traceback;
  EXPECT_NE((*r)->traceback.find("allocating activations 48 GiB\n"), std::string::npos);

  std::vector<WorkerFailure> exited = {Failure(2, ExitStatus::Exited(3), At(1700000000))};
  ASSERT_TRUE(WriteAgentErrorFile(dir / "agent2.json", exited).ok());
  auto r2 = ReadErrorFile(dir / "agent2.json");
  ASSERT_TRUE(r2.ok() && r2->has_value());
  EXPECT_EQ((*r2)->message, "Rank 2 (local_rank: 2, pid: 1002) exited with code 3");
  EXPECT_EQ((*r2)->error_code, 3);

  // Everyone stopped by ctrun: a file naming the reason, only when one is given.
  std::vector<WorkerFailure> stopped = {Failure(0, ExitStatus::Signaled(15), At(1), true)};
  ASSERT_TRUE(WriteAgentErrorFile(dir / "agent3.json", stopped).ok());
  EXPECT_FALSE(fs::exists(dir / "agent3.json"));
  SummaryOptions o;
  o.stop_reason = "ctrun received signal 2 (SIGINT)";
  ASSERT_TRUE(WriteAgentErrorFile(dir / "agent3.json", stopped, o).ok());
  auto r3 = ReadErrorFile(dir / "agent3.json");
  ASSERT_TRUE(r3.ok() && r3->has_value());
  EXPECT_EQ((*r3)->message, "ctrun stopped every worker: ctrun received signal 2 (SIGINT)");
}

// ---------------------------------------------------------------------------------------------
// OOM counter

TEST(ReportOom, ParsesCounterLines) {
  EXPECT_EQ(ParseOomKillCounter("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n"), 2u);
  EXPECT_EQ(ParseOomKillCounter("oom_kill_disable 0\nunder_oom 0\noom_kill 17\n"), 17u);
  EXPECT_EQ(ParseOomKillCounter("oom_kill_disable 0\nunder_oom 0\n"), std::nullopt);
  EXPECT_EQ(ParseOomKillCounter("oom_kill x\n"), std::nullopt);
  EXPECT_EQ(ParseOomKillCounter(""), std::nullopt);
}

TEST(ReportOom, ParsesProcSelfCgroup) {
  auto v2 = ParseProcSelfCgroup("0::/user.slice/user-1000.slice/session-3.scope\n");
  ASSERT_TRUE(v2.has_value());
  EXPECT_FALSE(v2->v1);
  EXPECT_EQ(v2->path, "/user.slice/user-1000.slice/session-3.scope");
  auto hybrid = ParseProcSelfCgroup(
      "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/\n");
  ASSERT_TRUE(hybrid.has_value());
  EXPECT_TRUE(hybrid->v1);
  EXPECT_EQ(hybrid->path, "/process_api/abc");
  auto joined = ParseProcSelfCgroup("5:cpuset,memory:/job\n");
  ASSERT_TRUE(joined.has_value());
  EXPECT_TRUE(joined->v1);
  EXPECT_FALSE(ParseProcSelfCgroup("garbage\n").has_value());
}

TEST(ReportOom, ReadsCgroupV2MemoryEvents) {
  TempDir root;
  WriteText(root / "proc/self/cgroup", "0::/job.slice/run-7.scope\n");
  WriteText(root / "sys/fs/cgroup/job.slice/run-7.scope/memory.events",
            "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\noom_group_kill 0\n");
  WriteText(root / "proc/vmstat", "nr_free_pages 1\noom_kill 99\n");
  auto s = ReadOomKillSample(root.path());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->count, 1u);
  EXPECT_EQ(s->source, "cgroup memory.events");
  EXPECT_EQ(ReadOomKillCount(root.path()), 1u);
}

TEST(ReportOom, WalksUpWhenTheCgroupPathIsNotMountedAsIs) {
  // A container that mounts its own cgroup at /sys/fs/cgroup: the host path is not there.
  TempDir root;
  WriteText(root / "proc/self/cgroup", "0::/kubepods/pod1/ctr2\n");
  WriteText(root / "sys/fs/cgroup/memory.events", "oom 4\noom_kill 4\n");
  EXPECT_EQ(ReadOomKillCount(root.path()), 4u);
}

TEST(ReportOom, ReadsCgroupV1OomControl) {
  TempDir root;
  WriteText(root / "proc/self/cgroup", "4:memory:/process_api/abc\n0::/\n");
  WriteText(root / "sys/fs/cgroup/memory/process_api/abc/memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  auto s = ReadOomKillSample(root.path());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->count, 3u);
  EXPECT_EQ(s->source, "cgroup memory.oom_control");
}

TEST(ReportOom, FallsBackToVmstatThenNothing) {
  TempDir root;
  WriteText(root / "proc/self/cgroup", "0::/x\n");
  WriteText(root / "proc/vmstat", "pgfault 5\noom_kill 12\n");
  auto s = ReadOomKillSample(root.path());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->count, 12u);
  EXPECT_EQ(s->source, "/proc/vmstat");

  TempDir empty;
  EXPECT_FALSE(ReadOomKillSample(empty.path()).has_value());
}

TEST(ReportOom, RealSystemReadDoesNotCrash) {
  // Whatever this machine has; only the shape is checked.
  auto s = ReadOomKillSample();
  if (s) {
    EXPECT_FALSE(s->source.empty());
  }
}

TEST(ReportOom, LikelyOomKilledRule) {
  std::optional<OomKillSample> before = OomKillSample{2, "cgroup memory.events"};
  std::optional<OomKillSample> after = OomKillSample{3, "cgroup memory.events"};
  std::optional<OomKillSample> same = OomKillSample{2, "cgroup memory.events"};
  std::optional<OomKillSample> other = OomKillSample{9, "/proc/vmstat"};
  EXPECT_TRUE(LikelyOomKilled(ExitStatus::Signaled(9), false, before, after));
  EXPECT_FALSE(LikelyOomKilled(ExitStatus::Signaled(9), true, before, after));   // ctrun sent it
  EXPECT_FALSE(LikelyOomKilled(ExitStatus::Signaled(15), false, before, after));  // not SIGKILL
  EXPECT_FALSE(LikelyOomKilled(ExitStatus::Exited(137), false, before, after));   // an exit code
  EXPECT_FALSE(LikelyOomKilled(ExitStatus::Signaled(9), false, before, same));    // no new kill
  EXPECT_FALSE(LikelyOomKilled(ExitStatus::Signaled(9), false, before, other));   // not comparable
  EXPECT_FALSE(LikelyOomKilled(ExitStatus::Signaled(9), false, std::nullopt, after));
}

}  // namespace
}  // namespace ctrun
