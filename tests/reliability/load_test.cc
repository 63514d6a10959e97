// Load: 256 local workers through 5 restarts (bounded time, ctrun's peak RSS measured and bounded);
// the store under 10,000 connections and 1 GiB of values (bounded memory); 64 agents on loopback
// through the c10d rendezvous. Each prints its figures as "[reliability] load ...".
#include <sys/resource.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "helpers/ctrun_command.h"
#include "helpers/free_port.h"
#include "helpers/test_util.h"
#include "reliability/hygiene.h"
#include "store/store_client.h"
#include "store/store_test_util.h"

namespace ctrun::reliability {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The memory bounds are checked in the uninstrumented build (the test command's first pass). Under
// ASan most of a process's RSS is the sanitizer's own (shadow memory, a quarantine of freed blocks
// up to 256 MiB), so the sanitizer pass runs the same loads and checks everything else.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMemoryBounds = false;
#else
constexpr bool kMemoryBounds = true;
#endif
using ctrun::testing::BackgroundProcess;
using ctrun::testing::Ctrun;
using ctrun::testing::ReadEnvFile;
using ctrun::testing::ReadFileOr;
using ctrun::testing::TempDir;

long ChildrenPeakRssKib() {
  rusage ru{};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_maxrss;
}

TEST(Load, TwoHundredFiftySixWorkersThroughFiveRestarts) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  fs::create_directories(dir / "touch");
  const auto start = std::chrono::steady_clock::now();
  // The last rank fails in attempts 0-4; attempt 5 succeeds.
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=256", "--max_restarts=5", "--shutdown-timeout=10"},
                              {"--touch", dir / "touch", "--only-rank", "255", "--exit", "1", "--attempts-below", "5"}),
                        {MarkerEnv(marker), "TMPDIR=" + dir.path()}, dir / "out", dir / "err");
  // A deadline for a hang only: how fast it goes is measured (printed below and in bench/), not
  // asserted; under ASan on a busy 2-core machine it has taken 100 s.
  const int code = job.Wait(240s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // On failure, the end of ctrun's stderr: the attempt that failed, its root cause and summary.
  const std::string err = ReadFileOr(dir / "err");
  ASSERT_EQ(code, 0) << err.substr(err.size() > 6000 ? err.size() - 6000 : 0);
  // ctrun is the largest process this test waited for (the fake workers are ~1-2 MiB each).
  const long peak_kib = ChildrenPeakRssKib();
  EXPECT_EQ(DirEntries(dir / "touch").size(), 256u);
  const auto gone_start = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{});
  std::printf("[reliability] load: job gone %.2f s after ctrun's exit\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - gone_start).count());
  if (kMemoryBounds) {
    EXPECT_LT(peak_kib, 64 * 1024) << "ctrun's peak RSS";
  }
  std::printf("[reliability] load: 256 workers x 6 attempts in %.2f s, ctrun peak RSS %ld KiB\n", seconds, peak_kib);
}

TEST(Load, StoreTakesTenThousandConnectionsAndAGibibyteOfValues) {
  // The server runs as its own process (ctrun_store_server), so its memory is measured alone and
  // each side needs only 10,000 fds.
  if (store::testing::RaiseFdLimit(12000) < 10100) GTEST_SKIP() << "cannot raise RLIMIT_NOFILE to 10100";
  TempDir dir;
  BackgroundProcess server({STORE_SERVER, "--max-connections", "12000", "--ignore-stdin"}, {}, dir / "out", dir / "err");
  int port = 0;
  ASSERT_TRUE(ctrun::testing::WaitFor([&] { return std::sscanf(ReadFileOr(dir / "out").c_str(), "PORT %d", &port) == 1; },
                                      20s))
      << ReadFileOr(dir / "err");
  const long rss_start = RssKib(server.pid());
  std::vector<UniqueFd> conns;
  conns.reserve(10000);
  for (int i = 0; i < 10000; ++i) {
    conns.push_back(store::testing::RawConnect(port));
    ASSERT_TRUE(conns.back()) << "connection " << i;
  }
  // The server has accepted all of them when one more client's request is answered (accepts are
  // served in order by one loop); then each connection's state is in its RSS.
  store::ClientOptions co;
  co.port = port;
  auto client = store::StoreClient::Connect(co);
  ASSERT_TRUE(client.ok()) << client.message();
  ASSERT_TRUE((*client)->Set("ping", "1").ok());
  const long rss_connected = RssKib(server.pid());
  conns.clear();

  // 1 GiB of values: 256 SETs of 4 MiB over 16 keys; the store keeps only the latest 16 (64 MiB).
  const size_t kValue = 4u << 20;
  std::string value(kValue, 'v');
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 256; ++i) {
    value[0] = static_cast<char>(i);
    ASSERT_TRUE((*client)->Set("big/" + std::to_string(i % 16), value).ok()) << i;
  }
  auto back = (*client)->Get("big/15");
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(back->size(), kValue);
  EXPECT_EQ((*back)[0], static_cast<char>(255));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const long peak = PeakRssKib(server.pid());
  if (kMemoryBounds) {
    EXPECT_LT(peak, rss_start + 256 * 1024) << "the store's memory grew with what it should have dropped";
    EXPECT_LT(rss_connected - rss_start, 256 * 1024) << "10,000 idle connections";
  }
  std::printf("[reliability] load: store with 10000 connections: RSS %ld -> %ld KiB; 1 GiB of values in %.2f s, "
              "peak RSS %ld KiB\n",
              rss_start, rss_connected, seconds, peak);
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(10s), 0);
}

TEST(Load, SixtyFourAgentsOnLoopback) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  const int port = ctrun::testing::FreePort();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<BackgroundProcess>> agents;
  for (int i = 0; i < 64; ++i) {
    agents.push_back(std::make_unique<BackgroundProcess>(
        Ctrun({"--nnodes=64", "--nproc_per_node=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
               "--rdzv_id=load64", "--rdzv_conf=join_timeout=120,last_call_timeout=1", "--local_addr=127.0.0.1"},
              {"--env-file", dir / ("env" + std::to_string(i))}),
        std::vector<std::string>{MarkerEnv(marker), "TMPDIR=" + dir.path()}, dir / ("a" + std::to_string(i) + ".out"),
        dir / ("a" + std::to_string(i) + ".err")));
  }
  int ok = 0;
  for (int i = 0; i < 64; ++i) {
    const int code = agents[i]->Wait(180s);
    EXPECT_EQ(code, 0) << "agent " << i << ": " << ReadFileOr(dir / ("a" + std::to_string(i) + ".err"));
    ok += code == 0;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::set<std::string> ranks;
  for (int i = 0; i < 64; ++i) {
    for (const std::string& f : DirEntries(dir.path())) {
      if (f.rfind("env" + std::to_string(i) + ".", 0) != 0) continue;
      auto env = ReadEnvFile(dir / f);
      EXPECT_EQ(env["WORLD_SIZE"], "64");
      ranks.insert(env["RANK"]);
    }
  }
  EXPECT_EQ(ranks.size(), 64u);
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{});
  std::printf("[reliability] load: 64 agents on loopback, %d exited 0, %zu distinct ranks, %.2f s\n", ok, ranks.size(),
              seconds);
}

}  // namespace
}  // namespace ctrun::reliability
