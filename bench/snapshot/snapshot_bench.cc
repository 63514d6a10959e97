// snapshot_bench: step-time overhead of an asynchronous snapshot versus a synchronous one.
//
// A "model" of --mb megabytes of float parameters is updated by a memory-bound "training step"
// (a fused multiply-add over every parameter, like an optimizer step). Every --every steps the
// parameters are snapshotted through ctrun::worker::SnapshotStore:
//   sync:  copy the parameters into a buffer, then save() on the training thread (crc32c, write,
//          fsync, rename, fsync dir) before the next step;
//   async: copy the parameters into a buffer on the training thread (the only part that needs a
//          consistent model), then save_async(); the write overlaps the following steps.
// Prints per mode: mean step time without snapshot, mean/max time of snapshot steps, and the
// overhead per snapshot relative to a plain step.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ctrun/snapshot_store.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Result {
  double plain_ms = 0;
  double snap_mean_ms = 0;
  double snap_max_ms = 0;
  double total_s = 0;
};

Result RunMode(const std::string& mode, std::vector<float>& params, int steps, int every, const std::string& dir,
               int zstd, bool fsync) {
  std::filesystem::remove_all(dir);
  ctrun::worker::SnapshotOptions o;
  o.dir = dir;
  o.keep_last = 2;
  o.zstd_level = zstd;
  o.fsync = fsync;
  ctrun::worker::SnapshotStore store(o);
  double plain = 0, snap = 0, snap_max = 0;
  int nplain = 0, nsnap = 0;
  const auto t_start = Clock::now();
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = Clock::now();
    for (float& p : params) p = p * 0.999f + 0.001f;  // the "optimizer step"
    const bool snapshot = mode != "none" && s % every == 0;
    if (snapshot) {
      std::vector<std::byte> buf = store.take_buffer();  // reuse the last written buffer's pages
      buf.resize(params.size() * sizeof(float));
      std::memcpy(buf.data(), params.data(), buf.size());
      if (mode == "sync") {
        store.save(static_cast<uint64_t>(s), buf);
      } else {
        store.save_async(static_cast<uint64_t>(s), std::move(buf));
      }
    }
    const double ms = Ms(Clock::now() - t0);
    if (snapshot) {
      snap += ms;
      snap_max = std::max(snap_max, ms);
      ++nsnap;
    } else {
      plain += ms;
      ++nplain;
    }
  }
  store.wait();
  Result r;
  r.total_s = Ms(Clock::now() - t_start) / 1000.0;
  r.plain_ms = nplain ? plain / nplain : 0;
  r.snap_mean_ms = nsnap ? snap / nsnap : 0;
  r.snap_max_ms = snap_max;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 300;
  int steps = 40, every = 10, zstd = 0;
  bool fsync = true;
  std::string dir = "/tmp/ctrun_snapshot_bench";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* k) { return a.rfind(k, 0) == 0 ? a.substr(std::strlen(k)) : std::string(); };
    if (auto v = val("--mb="); !v.empty()) mb = std::stoul(v);
    if (auto v = val("--steps="); !v.empty()) steps = std::stoi(v);
    if (auto v = val("--every="); !v.empty()) every = std::stoi(v);
    if (auto v = val("--zstd="); !v.empty()) zstd = std::stoi(v);
    if (auto v = val("--dir="); !v.empty()) dir = v;
    if (a == "--no-fsync") fsync = false;
  }
  std::vector<float> params(mb * (1u << 20) / sizeof(float), 1.0f);
  std::printf("model %zu MB, %d steps, snapshot every %d steps, zstd %d, fsync %s, dir %s\n", mb, steps, every, zstd,
              fsync ? "on" : "off", dir.c_str());
  std::printf("%-6s %14s %16s %15s %18s %10s\n", "mode", "plain step ms", "snapshot step ms", "max snap step",
              "overhead/snapshot", "total s");
  for (const char* mode : {"none", "sync", "async"}) {
    Result r = RunMode(mode, params, steps, every, dir, zstd, fsync);
    const double overhead = std::string(mode) == "none" ? 0 : r.snap_mean_ms - r.plain_ms;
    std::printf("%-6s %14.1f %16.1f %15.1f %18.1f %10.2f\n", mode, r.plain_ms, r.snap_mean_ms, r.snap_max_ms, overhead,
                r.total_s);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
