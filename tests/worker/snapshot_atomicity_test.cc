// Snapshot atomicity: a writer process SIGKILLed at random points during saves never leaves a
// snapshot that a load accepts wrongly. After each kill the newest loadable snapshot must be the
// last save the writer reported complete (or the one it was finishing), with exactly that step's
// bytes, and no final-named file may be rejected (torn files only ever exist under temp names).
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "ctrun/snapshot_store.h"
#include "helpers/test_util.h"
#include "worker/pattern.h"

namespace ctrun::worker {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::Pattern;
using ctrun::testing::ReadFileOr;
using ctrun::testing::SplitLines;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;

uint64_t LastSaved(const std::string& out_path) {
  uint64_t last = 0;
  for (const std::string& l : SplitLines(ReadFileOr(out_path))) {
    if (l.rfind("saved ", 0) == 0) last = std::stoull(l.substr(6));
  }
  return last;
}

TEST(SnapshotAtomicity, WriterKilledAtRandomPointsNeverYieldsABadSnapshot) {
  TempDir dir;
  const std::string snaps = dir / "snaps";
  std::mt19937 rng(std::random_device{}());
  uint64_t next_step = 1;
  uint64_t last_good = 0;
  int kills_mid_save = 0;
  for (int round = 0; round < 12; ++round) {
    const std::string out = dir / ("out" + std::to_string(round));
    BackgroundProcess writer({WORKER_HELPER, "snapshot-writer", snaps, std::to_string(next_step)}, {}, out,
                             dir / "err");
    // Let it complete at least one save of this round, then kill it at a random moment: the
    // saves take a few ms each, so most kills land inside write/fsync/rename.
    ASSERT_TRUE(WaitFor([&] { return LastSaved(out) >= next_step; }, 30s)) << ReadFileOr(dir / "err");
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
    writer.Signal(SIGKILL);
    ASSERT_NE(writer.Wait(10s), -1);
    const uint64_t reported = LastSaved(out);

    SnapshotOptions o;
    o.dir = snaps;
    o.keep_last = 2;
    SnapshotStore store(o);  // also removes the dead writer's temp file
    LoadResult r = store.load_latest();
    ASSERT_TRUE(r.snapshot);
    EXPECT_TRUE(r.skipped.empty()) << r.skipped.front();
    // The rename of the save after `reported` may have happened before the kill.
    EXPECT_TRUE(r.snapshot->step == reported || r.snapshot->step == reported + 1)
        << "loaded " << r.snapshot->step << ", writer reported " << reported;
    EXPECT_GE(r.snapshot->step, last_good);
    EXPECT_EQ(r.snapshot->data, Pattern(r.snapshot->step)) << "step " << r.snapshot->step;
    if (r.snapshot->step == reported) ++kills_mid_save;
    for (const auto& e : std::filesystem::directory_iterator(snaps)) {
      EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "temp file left: " << e.path();
    }
    last_good = r.snapshot->step;
    next_step = r.snapshot->step + 1;  // resume as a restarted trainer would
  }
  RecordProperty("kills_between_report_and_next_rename", kills_mid_save);
}

}  // namespace
}  // namespace ctrun::worker
