#include "gpu/gpu_release.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "sys/proc_fs.h"

namespace ctrun {

ProcState ReadProcState(pid_t pid) {
  ProcState st;
  const std::optional<ProcStat> stat = ReadProcStat("/proc", pid);
  if (!stat) return st;
  st.exists = true;
  st.state = stat->state;
  st.pgrp = stat->pgrp;
  return st;
}

GpuReleaseWaiter::GpuReleaseWaiter(GpuDriver& driver, std::vector<int> devices, TimerQueue& timers,
                                   ProcStateReader proc, Options options)
    : driver_(driver),
      devices_(std::move(devices)),
      timers_(timers),
      proc_(std::move(proc)),
      options_(std::move(options)) {
  if (!options_.warn) options_.warn = [](const std::string& line) { spdlog::warn("{}", line); };
}

GpuReleaseWaiter::~GpuReleaseWaiter() {
  if (timer_) timers_.CancelTimer(*timer_);
}

void GpuReleaseWaiter::Wait(std::vector<pid_t> worker_pids, std::function<void(Status)> done) {
  if (timer_) timers_.CancelTimer(*timer_);
  timer_.reset();
  ours_ = std::move(worker_pids);
  done_ = std::move(done);
  deadline_ = timers_.Now() + options_.timeout;
  Check();
}

std::vector<std::string> GpuReleaseWaiter::Holders(bool* any_d_state) {
  std::vector<std::string> out;
  auto is_ours = [&](pid_t p) { return std::find(ours_.begin(), ours_.end(), p) != ours_.end(); };
  for (int dev : devices_) {
    auto procs = driver_.Processes(dev);
    if (!procs.ok()) {  // the driver cannot tell: nothing to wait for on this GPU, said once
      if (unlistable_.insert(dev).second)
        options_.warn("restarts do not wait for GPU " + std::to_string(dev) +
                      " to be released by the previous attempt: " + procs.message());
      continue;
    }
    for (const GpuProcess& p : procs.value()) {
      const ProcState st = proc_(p.pid);
      if (!is_ours(p.pid) && !(st.exists && is_ours(st.pgrp))) continue;
      std::string what = "pid " + std::to_string(p.pid) + " (GPU " + std::to_string(dev);
      if (!st.exists) what += ", exited, context not yet released";
      if (st.exists && st.state == 'D') {
        what += ", state D: uninterruptible, cannot be killed";
        *any_d_state = true;
      }
      out.push_back(what + ")");
    }
  }
  return out;
}

void GpuReleaseWaiter::Check() {
  timer_.reset();
  bool d_state = false;
  const std::vector<std::string> holders = Holders(&d_state);
  if (holders.empty()) {
    auto done = std::move(done_);
    done(Status::Ok());
    return;
  }
  if (timers_.Now() >= deadline_) {
    std::string list;
    for (const auto& h : holders) list += (list.empty() ? "" : ", ") + h;
    auto done = std::move(done_);
    done(Status::Error("not restarting: the previous attempt still holds GPUs after " +
                       std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options_.timeout).count()) +
                       " s: " + list));
    return;
  }
  timer_ = timers_.AddTimer(std::min(timers_.Now() + options_.interval, deadline_), [this] { Check(); });
}

}  // namespace ctrun
