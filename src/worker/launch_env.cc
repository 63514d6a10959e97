#include "ctrun/launch_env.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

namespace ctrun::worker {
namespace {

constexpr const char* kHowToLaunch =
    " (not launched by ctrun/torchrun? run it as: ctrun --standalone --nproc_per_node=N <program> "
    "args...)";

// Strict decimal parse: the whole string, no sign unless allowed, within [lo, hi].
bool ParseInt(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  long long v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return false;
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

std::optional<LaunchEnv> LaunchEnv::parse(const Lookup& lookup, std::string* error) {
  LaunchEnv env;
  std::string err;
  auto fail = [&](const std::string& msg) -> std::optional<LaunchEnv> {
    if (error) *error = "ctrun::worker: " + msg;
    return std::nullopt;
  };
  auto get_int = [&](const char* name, bool required, long long lo, long long hi, long long dflt,
                     long long* out) -> bool {
    auto v = lookup(name);
    if (!v || v->empty()) {
      if (required) {
        err = std::string(name) + " is not set" + kHowToLaunch;
        return false;
      }
      *out = dflt;
      return true;
    }
    if (!ParseInt(*v, lo, hi, out)) {
      err = std::string(name) + "='" + *v + "' is not an integer in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]";
      return false;
    }
    return true;
  };
  constexpr long long kMaxInt = std::numeric_limits<int>::max();
  long long rank, world, local_rank, local_world, group_rank, restarts, max_restarts, port;
  if (!get_int("RANK", true, 0, kMaxInt, 0, &rank)) return fail(err);
  if (!get_int("WORLD_SIZE", true, 1, kMaxInt, 1, &world)) return fail(err);
  if (!get_int("LOCAL_RANK", true, 0, kMaxInt, 0, &local_rank)) return fail(err);
  if (!get_int("LOCAL_WORLD_SIZE", false, 1, kMaxInt, world, &local_world)) return fail(err);
  if (!get_int("GROUP_RANK", false, 0, kMaxInt, 0, &group_rank)) return fail(err);
  if (!get_int("TORCHELASTIC_RESTART_COUNT", false, 0, kMaxInt, 0, &restarts)) return fail(err);
  if (!get_int("TORCHELASTIC_MAX_RESTARTS", false, 0, kMaxInt, 0, &max_restarts)) return fail(err);
  if (!get_int("MASTER_PORT", true, 1, 65535, 0, &port)) return fail(err);
  auto addr = lookup("MASTER_ADDR");
  if (!addr || addr->empty()) return fail(std::string("MASTER_ADDR is not set") + kHowToLaunch);
  if (rank >= world) {
    return fail("RANK=" + std::to_string(rank) + " is not below WORLD_SIZE=" + std::to_string(world));
  }
  if (local_rank >= local_world) {
    return fail("LOCAL_RANK=" + std::to_string(local_rank) + " is not below LOCAL_WORLD_SIZE=" +
                std::to_string(local_world));
  }
  if (local_world > world) {
    return fail("LOCAL_WORLD_SIZE=" + std::to_string(local_world) + " exceeds WORLD_SIZE=" +
                std::to_string(world));
  }
  env.rank = static_cast<int>(rank);
  env.world_size = static_cast<int>(world);
  env.local_rank = static_cast<int>(local_rank);
  env.local_world_size = static_cast<int>(local_world);
  env.group_rank = static_cast<int>(group_rank);
  env.restart_count = static_cast<int>(restarts);
  env.max_restarts = static_cast<int>(max_restarts);
  env.master_addr = *addr;
  env.master_port = static_cast<uint16_t>(port);
  env.run_id = lookup("TORCHELASTIC_RUN_ID").value_or("");
  // torch compares against str(True): "True" exactly; anything else means worker-hosted.
  env.use_agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  env.error_file = lookup("TORCHELASTIC_ERROR_FILE").value_or("");
  return env;
}

namespace {

bool TracerAttached() {
  std::FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return false;
  char line[256];
  bool traced = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "TracerPid:", 10) == 0) {
      traced = std::atoi(line + 10) != 0;
      break;
    }
  }
  std::fclose(f);
  return traced;
}

// CTRUN_WAIT_FOR_DEBUGGER_RANK=<rank>|all: that rank stops here until a debugger attaches. The
// rank is parsed strictly (decimal, the whole value, below WORLD_SIZE): anything else ("yes",
// "1.5", a rank the job does not have) stops no rank and says so on stderr, on every rank.
void MaybeWaitForDebugger(int rank, int world_size) {
  const char* v = std::getenv("CTRUN_WAIT_FOR_DEBUGGER_RANK");
  if (v == nullptr || *v == '\0') return;
  if (std::strcmp(v, "all") != 0) {
    long long wanted = 0;
    if (!ParseInt(v, 0, world_size - 1, &wanted)) {
      std::fprintf(stderr,
                   "ctrun::worker: CTRUN_WAIT_FOR_DEBUGGER_RANK='%s' is neither a rank in [0, %d] nor \"all\"; "
                   "not waiting for a debugger\n",
                   v, world_size - 1);
      return;
    }
    if (wanted != rank) return;
  }
  std::fprintf(stderr, "ctrun::worker: rank %d (pid %d) waiting up to 600 s for a debugger to attach\n", rank,
               static_cast<int>(::getpid()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
  while (!TracerAttached() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

LaunchEnv LaunchEnv::from_env() {
  std::string error;
  auto env = parse(
      [](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      },
      &error);
  if (!env) throw EnvError(error);
  MaybeWaitForDebugger(env->rank, env->world_size);
  return *env;
}

}  // namespace ctrun::worker
