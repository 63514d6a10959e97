#include "health/health_monitor.h"

#include <algorithm>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "base/environment.h"
#include "ctrun/heartbeat.h"
#include "sys/posix_util.h"

namespace ctrun::health {

ParsedBeat ParseBeat(std::string_view d) {
  ParsedBeat beat;
  size_t start = 0;
  while (start < d.size()) {
    size_t end = d.find('\n', start);
    if (end == std::string_view::npos) end = d.size();
    std::string_view line = d.substr(start, end - start);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
    if (ec == std::errc() && (p == line.data() + line.size() || *p == ' ' || *p == '\r' || *p == '\t')) {
      beat.step = v;
      std::string_view rest = line.substr(static_cast<size_t>(p - line.data()));
      while (!rest.empty() && (rest.back() == '\r' || rest.back() == ' ')) rest.remove_suffix(1);
      const std::string_view mark = worker::kHeartbeatCounterMark;  // the line's last field
      beat.counter = rest.size() > mark.size() && rest.ends_with(mark) && rest[rest.size() - mark.size() - 1] == ' ';
    }
    start = end + 1;
  }
  return beat;
}

std::string HeartbeatId(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  return std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
         std::to_string(static_cast<unsigned long long>(st.st_ino));
}

HealthMonitor::HealthMonitor(EventLoop& loop, HangWatchOptions options, StackTools tools, Duration stack_timeout,
                             std::function<std::string(int)> rank_dir)
    : loop_(loop),
      options_(options),
      watcher_(loop, options,
               [this](int rank, const std::string& why, const std::vector<int>& also_silent) {
                 if (on_hang_) on_hang_(rank, why, also_silent);
               }),
      tools_(std::move(tools)),
      stack_timeout_(stack_timeout),
      rank_dir_(std::move(rank_dir)),
      buf_(4096) {}

HealthMonitor::~HealthMonitor() { CloseChannels(); }

void HealthMonitor::CloseChannels() {
  for (Channel& c : channels_)
    if (c.agent_end) loop_.RemoveFd(c.agent_end.get());
  channels_.clear();
}

void HealthMonitor::PrepareWorker(int attempt, int local_rank, SpawnSpec* spec) {
  if (options_.heartbeat <= Duration::zero()) return;
  if (attempt != attempt_) {  // a new attempt: the old workers are gone, and so are their channels
    CloseChannels();
    attempt_ = attempt;
  }
  if (channels_.size() <= static_cast<size_t>(local_rank)) channels_.resize(static_cast<size_t>(local_rank) + 1);
  Channel& c = channels_[static_cast<size_t>(local_rank)];
  // Whatever the launcher's own environment said is not this worker's channel.
  EraseEntries(&spec->env, worker::kHeartbeatFdVariable);
  EraseEntries(&spec->env, worker::kHeartbeatIdVariable);
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) {
    NoChannel(local_rank, std::string("socketpair: ") + std::strerror(errno));
    return;
  }
  c.agent_end = UniqueFd(sv[0]);
  c.worker_end = UniqueFd(sv[1]);
  SetNonBlocking(sv[0], true);
  if (Status st = loop_.AddFd(sv[0], EPOLLIN, [this, local_rank](uint32_t) { OnReadable(local_rank); }); !st.ok()) {
    c = Channel{};
    NoChannel(local_rank, st.message());
    return;
  }
  spec->env.push_back(std::string(worker::kHeartbeatFdVariable) + "=" + std::to_string(kHeartbeatFd));
  if (std::string id = HeartbeatId(sv[1]); !id.empty())  // never empty: fstat of an open socket
    spec->env.push_back(std::string(worker::kHeartbeatIdVariable) + "=" + id);
  spec->extra_fd = sv[1];
  spec->extra_fd_target = kHeartbeatFd;
}

// The rank runs without beats this attempt. AttemptStarted then turns its heartbeat deadline off
// (its output deadline, if any, still holds): without a channel its silence is not a hang.
void HealthMonitor::NoChannel(int local_rank, const std::string& why) {
  spdlog::warn("local rank {}: cannot create its heartbeat channel ({}); its heartbeats are not watched "
               "in this attempt", local_rank, why);
}

void HealthMonitor::AttemptStarted(int nranks, bool judge) {
  for (Channel& c : channels_) c.worker_end.reset();  // the workers hold their copies now
  watcher_.Start(nranks, judge);
  if (options_.heartbeat <= Duration::zero()) return;
  for (int i = 0; i < nranks; ++i)
    if (static_cast<size_t>(i) >= channels_.size() || !channels_[static_cast<size_t>(i)].agent_end)
      watcher_.IgnoreBeats(i);
}

void HealthMonitor::OnReadable(int local_rank) {
  const int fd = channels_[static_cast<size_t>(local_rank)].agent_end.get();
  for (;;) {
    // MSG_TRUNC: the datagram's whole length, so a cut one is known as cut.
    ssize_t n = RetryOnEintr([&] { return ::recv(fd, buf_.data(), buf_.size(), MSG_DONTWAIT | MSG_TRUNC); });
    if (n < 0) return;  // EAGAIN: all read
    std::string_view got(buf_.data(), std::min(static_cast<size_t>(n), buf_.size()));
    // A datagram longer than the buffer: its complete lines only (a number cut at the buffer's
    // end, "12" of "12345", is not a step).
    if (static_cast<size_t>(n) > buf_.size()) got = got.substr(0, got.rfind('\n') + 1);
    const ParsedBeat beat = ParseBeat(got);
    watcher_.Beat(local_rank, beat.step, /*comparable=*/!beat.counter);
    if (n == 0) return;  // an empty datagram (never an end of stream: level-triggered, we come back)
  }
}

AttemptBeats HealthMonitor::AttemptProgress() {
  for (size_t i = 0; i < channels_.size(); ++i)
    if (channels_[i].agent_end) OnReadable(static_cast<int>(i));
  return {watcher_.max_step(), watcher_.any_beat()};
}

MainThreadWait HealthMonitor::MainThreadOf(int local_rank, pid_t pid) {
  const std::string dir = rank_dir_ ? rank_dir_(local_rank) : "";
  if (dir.empty()) return MainThreadWait::kUnknown;
  // Bounded: a process with thousands of threads writes megabytes; the main thread comes early
  // in eu-stack's output and last in gdb's, so a cut file only says less.
  return ClassifyMainThread(ReadFileHead(dir + "/stacks/native." + std::to_string(pid) + ".txt", 8 << 20), pid);
}

void HealthMonitor::CaptureStacks(int local_rank, pid_t pgid, OnStacks done) {
  const std::string dir = rank_dir_ ? rank_dir_(local_rank) : "";
  StackCapture* idle = nullptr;
  for (auto& c : captures_)
    if (!c->busy()) idle = c.get();
  if (!idle) idle = captures_.emplace_back(std::make_unique<StackCapture>(loop_, tools_, stack_timeout_)).get();
  idle->Capture(pgid, dir.empty() ? "" : dir + "/stacks", std::move(done));
}

}  // namespace ctrun::health
