// ctrun: parse, check, run. The only place that catches exceptions (CLI11 and spdlog setup).
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/death_cleanup.h"
#include "agent/dry_run.h"
#include "agent/job_outcome.h"
#include "agent/launch_checks.h"
#include "agent/runner.h"
#include "agent/worker_env.h"
#include "agent/worker_limits.h"
#include "cli/cli.h"
#include "cli/cluster_env.h"
#include "gpu/gpu_probe.h"
#include "gpu/nvml_driver.h"
#include "placement/job_placement.h"
#include "process/watchdog.h"
#include "logs/logging.h"
#include "logs/output_plan.h"
#include "rendezvous/settings.h"
#include "report/events.h"
#include "report/github_annotation.h"
#include "report/run_end.h"
#include "sys/posix_util.h"

namespace {

// A version-4 UUID from the kernel's CSPRNG, spelt as torchrun's str(uuid.uuid4()):
// "xxxxxxxx-xxxx-4xxx-Yxxx-xxxxxxxxxxxx", Y one of 8, 9, a, b.
std::string RandomRunId() {
  std::string hex = ctrun::RandomHex(16);
  if (hex.size() != 32) return "standalone";
  hex[12] = '4';
  const int y = hex[16] <= '9' ? hex[16] - '0' : hex[16] - 'a' + 10;
  hex[16] = "89ab"[y & 3];
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
         hex.substr(20);
}

// The CPUs this process may run on (taskset, cpusets), for --nproc_per_node=cpu|auto; the
// online count only when the kernel will not say.
int CpuCount() {
  // A kernel built for more than CPU_SETSIZE (1024) possible CPUs refuses a smaller mask (EINVAL,
  // for this process and a valid buffer the one way it fails): ask again with a larger one, as
  // OwnAffinity in placement/job_placement.cc does.
  for (int ncpus = CPU_SETSIZE; ncpus <= (1 << 22); ncpus *= 2) {
    std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> set(CPU_ALLOC(ncpus), [](cpu_set_t* s) { CPU_FREE(s); });
    if (!set) break;
    const size_t size = CPU_ALLOC_SIZE(ncpus);
    if (sched_getaffinity(0, size, set.get()) == 0) return CPU_COUNT_S(size, set.get());
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// One line when --nproc_per_node=cpu (or auto without GPUs) counted fewer CPUs than the machine
// has online: torchrun's os.cpu_count() would start one worker per online CPU.
std::string CpuCountNotice(const ctrun::LaunchConfig& config, const ctrun::GpuInventory& gpus) {
  using Kind = ctrun::NprocSpec::Kind;
  const bool by_cpu = config.nproc.kind == Kind::kCpu || (config.nproc.kind == Kind::kAuto && gpus.count() <= 0);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (!by_cpu || online <= config.nproc_per_node) return "";
  return "--nproc_per_node=" + std::string(config.nproc.kind == Kind::kCpu ? "cpu" : "auto") + ": " +
         std::to_string(config.nproc_per_node) + (config.nproc_per_node == 1 ? " worker" : " workers") +
         ", one per CPU this process may run on (of " +
         std::to_string(online) + " online; torchrun would start " + std::to_string(online) + ")";
}

// GPUs counted from CUDA_VISIBLE_DEVICES alone (no GPU found on the machine) decide the number of
// workers only with a word: a CPU-only host that inherited the variable would otherwise start
// that many workers silently (torchrun counts CPUs there for `auto`, and fails for `gpu`).
std::string UnverifiedGpusNotice(const ctrun::LaunchConfig& config, const ctrun::GpuInventory& gpus) {
  using Kind = ctrun::NprocSpec::Kind;
  if (!gpus.as_written || (config.nproc.kind != Kind::kGpu && config.nproc.kind != Kind::kAuto)) return "";
  return std::string("--nproc_per_node=") + (config.nproc.kind == Kind::kGpu ? "gpu" : "auto") +
         ": no GPU was found on this machine (NVML, /proc/driver/nvidia, sysfs), so the GPUs are the entries of "
         "CUDA_VISIBLE_DEVICES as written: " + std::to_string(gpus.count()) +
         (config.nproc.kind == Kind::kAuto ? " (torchrun would count CPUs here)" : "");
}

std::string Hostname() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// Every way a run ends goes through Finish: the run_end event, --summary-file, the annotation.
class Ending {
 public:
  explicit Ending(const ctrun::Environment& env) : start_(std::chrono::system_clock::now()) {
    targets_.github_actions = ctrun::UnderGithubActions(env);
    if (const std::string* f = env.Get("TORCHELASTIC_ERROR_FILE")) targets_.agent_error_file = *f;
    identity_.version = ctrun::VersionNumber();
    identity_.hostname = Hostname();
  }
  void SetConfig(const ctrun::LaunchConfig& config) {
    targets_.summary_file = config.summary_file;
    identity_.run_id = config.run_id;
    identity_.node_rank = config.node_rank;
  }
  void SetEvents(ctrun::EventSink* events) { targets_.events = events; }
  // The --summary-file path was refused: the usage error is the one word about it.
  void DropSummaryFile() { targets_.summary_file.clear(); }
  const ctrun::RunIdentity& identity() const { return identity_; }

  // "ctrun: error: <msg>", exit 2.
  int Usage(const std::string& msg) {
    std::fprintf(stderr, "ctrun: error: %s\n", msg.c_str());
    return Finish(ctrun::EarlyOutcome(ctrun::OutcomeKind::kUsageError, msg));
  }
  int Finish(ctrun::RunOutcome outcome) {
    outcome.start = start_;
    outcome.end = std::chrono::system_clock::now();
    return ctrun::ReportRunEnd(outcome, identity_, targets_);
  }

 private:
  std::chrono::system_clock::time_point start_;
  ctrun::RunEndTargets targets_;
  ctrun::RunIdentity identity_;
};

// After a run: everything it owed anyone is out (RunJob drained the console; the events and the
// summary went out by write(2) as they happened), so ctrun ends without the destructors and exit
// handlers of a return from main, which only give back memory the kernel takes back anyway:
// 0.5-1.1 ms of a launch of 8 x /bin/true on the development VM (one interleaved 41-run A/B, two
// blocks of perf stat -r 100). Stdio is flushed first. Sanitizer builds return normally: their
// leak check runs at exit.
#if defined(__SANITIZE_ADDRESS__)
#define CTRUN_RETURN_FROM_MAIN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CTRUN_RETURN_FROM_MAIN 1
#endif
#endif
int EndAfterRun(int code) {
#ifndef CTRUN_RETURN_FROM_MAIN
  std::fflush(nullptr);
  ::_exit(code);
#endif
  return code;
}

// The CLI's one-line error without its "ctrun: error: " and newline.
std::string ErrorText(const std::string& line) {
  std::string s = line.rfind("ctrun: error: ", 0) == 0 ? line.substr(14) : line;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  // The cleanup of a SIGKILLed ctrun, exec'd by its ct-watchdog (process/watchdog.h).
  if (argc >= 2 && std::strcmp(argv[1], ctrun::kWatchdogCleanupFlag) == 0) {
    std::vector<std::string> args(argv + 2, argv + argc);
    if (const char* lines = std::getenv(ctrun::kWatchdogCleanupArgsVariable); args.empty() && lines) {
      for (std::string_view rest = lines;;) {  // one argument per line
        const size_t nl = rest.find('\n');
        args.emplace_back(rest.substr(0, nl));
        if (nl == std::string_view::npos) break;
        rest.remove_prefix(nl + 1);
      }
    }
    return ctrun::RunAgentDeathCleanup(args);
  }
  ctrun::OccupyClosedStdio();  // before anything opens an fd
  try {
    // ctrun's line format from the first word on (a line logged before the flags are read, say
    // about a --summary-file it cannot write, would otherwise take spdlog's default); the level
    // follows --log-level once parsed. Best effort: a failure here leaves spdlog's default.
    (void)ctrun::logs::SetupLogging(ctrun::LogLevel::kInfo);
    std::vector<std::string> args(argv, argv + argc);
    // The environment is read once; everything below looks values up in it.
    const ctrun::Environment env = ctrun::Environment::FromProcess();
    const ctrun::EnvLookup lookup = ctrun::LookupIn(env);
    Ending ending(env);
    ctrun::CliOutcome cli = ctrun::ParseCommandLine(args, lookup);
    if (cli.action == ctrun::CliOutcome::Action::kExit) {
      std::fputs(cli.output.c_str(), stdout);
      std::fputs(cli.error.c_str(), stderr);
      if (cli.exit_code == 0) return 0;  // --help, --version
      ending.SetConfig(cli.config);
      std::unique_ptr<ctrun::FileEventSink> events;
      if (!cli.config.events_file.empty())
        if (auto e = ctrun::FileEventSink::Open(cli.config.events_file, {ending.identity().hostname, ""}); e.ok())
          events = std::move(e.value());
      ending.SetEvents(events.get());
      return ending.Finish(ctrun::EarlyOutcome(ctrun::OutcomeKind::kUsageError, ErrorText(cli.error)));
    }
    ctrun::LaunchConfig config = std::move(cli.config);
    // torchrun --standalone picks a random run id; an explicit --rdzv_id is kept (ctrun extension).
    if (config.standalone && (config.run_id == "none" || config.run_id.empty())) config.run_id = RandomRunId();
    // An empty --rdzv_id (an unset $JOB_ID in a template): torchrun takes a random one. Across
    // nodes each would take its own and never meet the others: refused there instead, once the
    // node count is known (Slurm's below).
    const bool empty_run_id = config.run_id.empty();
    if (empty_run_id) config.run_id = RandomRunId();
    ending.SetConfig(config);
    std::unique_ptr<ctrun::FileEventSink> events;
    if (!config.events_file.empty()) {
      auto e = ctrun::FileEventSink::Open(config.events_file, {ending.identity().hostname, config.run_id});
      if (!e.ok()) return ending.Usage(e.message());
      events = std::move(e.value());
      ending.SetEvents(events.get());
    }
    if (!config.summary_file.empty())
      if (ctrun::Status s = ctrun::CheckSummaryPath(config.summary_file); !s.ok()) {
        ending.DropSummaryFile();
        return ending.Usage(s.message());
      }
    if (ctrun::Status s = ctrun::logs::SetupLogging(config.log_level); !s.ok()) return ending.Usage(s.message());
    const std::string* prefix_template = env.Get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    auto output_flags = ctrun::logs::ParseOutputFlags(config, prefix_template ? prefix_template->c_str() : nullptr);
    if (!output_flags.ok()) return ending.Usage(output_flags.message());
    if (const std::string& w = output_flags->prefix.warning(); !w.empty()) spdlog::warn("{}", w);

    // Under Slurm's srun with no node flags: nodes, node rank and master from SLURM_*.
    std::string cluster_notice;
    if (ctrun::Status s =
            ctrun::ApplyClusterEnv(&config, lookup, ctrun::DetectExplicitFlags(args, lookup), &cluster_notice);
        !s.ok())
      return ending.Usage(s.message());
    if (!cluster_notice.empty()) spdlog::info("{}", cluster_notice);
    if (empty_run_id && config.max_nodes > 1)
      return ending.Usage("--rdzv_id is empty: every node would take a random run id of its own and never "
                          "meet the others; give the job's id");
    if (empty_run_id) spdlog::warn("--rdzv_id is empty: the run id is the random {}", config.run_id);
    ending.SetConfig(config);  // the node rank may come from the cluster

    ctrun::RunContext ctx;
    ctx.env = env;
    ctx.output_flags = std::move(output_flags.value());
    ctx.hostname = ending.identity().hostname;

    if (ctrun::Status s = ctrun::rdzv::ResolveSettings(&config); !s.ok()) return ending.Usage(s.message());
    if (std::string notice = ctrun::MultiNodeRestartFlagsNotice(config); !notice.empty()) spdlog::warn("{}", notice);
    if (std::string notice = ctrun::EventLogHandlerNotice(config); !notice.empty()) spdlog::warn("{}", notice);
    // NVML only where it can exist (the NVIDIA kernel driver is loaded) and is of use.
    std::unique_ptr<ctrun::GpuDriver> nvml = ctrun::WantsGpuDriver(config) ? ctrun::LoadNvml() : nullptr;
    const ctrun::Environment parent_env = ctx.env;  // before the probe sets CUDA_VISIBLE_DEVICES: for --dry-run
    auto gpus = ctrun::ProbeGpus(config, lookup, nvml.get(), &ctx.env);
    if (!gpus.ok()) return ending.Usage(gpus.message());
    if (ctrun::Status s = ctrun::ResolveNproc(&config, gpus.value(), CpuCount()); !s.ok())
      return ending.Usage(s.message());
    if (std::string notice = CpuCountNotice(config, gpus.value()); !notice.empty()) spdlog::info("{}", notice);
    if (std::string notice = ctrun::MigListNotice(config, gpus.value()); !notice.empty()) spdlog::warn("{}", notice);
    if (std::string notice = UnverifiedGpusNotice(config, gpus.value()); !notice.empty()) spdlog::warn("{}", notice);
    if (ctrun::Status s = ctrun::CheckWorkerLimits(config.nproc_per_node, ctrun::ReadSystemLimits()); !s.ok())
      return ending.Usage(s.message());
    if (ctrun::Status s = ctrun::CheckGpuFlags(config, ctx.env); !s.ok()) return ending.Usage(s.message());
    auto placement = ctrun::PlanJobPlacement(config, gpus.value(), ctx.env);
    if (!placement.ok()) return ending.Usage(placement.message());
    ctx.placement = std::move(placement.value());
    ctx.gpu_driver = nvml.get();
    if (nvml)
      for (const auto& d : gpus.value().devices) ctx.gpu_indices.push_back(d.index);
    const std::string python_notice = ctrun::ClassifyEntrypoint(&config, env.Get("PATH"));
    // Looked for only where it runs the workers (not for a program, --no_python).
    const std::string python = ctrun::UsesPython(config) ? ctrun::FindPython(env) : "";
    auto executable = ctrun::ResolveEntrypoint(config, python, env);
    if (!executable.ok()) return ending.Usage(executable.message());
    ctx.executable = std::move(executable.value());
    if (!python_notice.empty()) spdlog::info("{}", python_notice);
    if (std::string notice = ctrun::PythonNotice(config, python, env); !notice.empty()) spdlog::info("{}", notice);
    if (config.dry_run) {
      std::fputs(ctrun::FormatDryRun(config, ctx.env, ctx.executable, ctx.hostname, &ctx.placement, &parent_env).c_str(),
                 stdout);
      return ending.Finish(ctrun::EarlyOutcome(ctrun::OutcomeKind::kDryRun, ""));
    }
    if (std::string notice = ctrun::OmpNotice(config, env); !notice.empty()) spdlog::info("{}", notice);
    if (std::string warning = ctrun::FileTimerWarning(env); !warning.empty()) spdlog::warn("{}", warning);

    if (events)
      events->Emit(ctrun::events::kRunStart,
                   {{"pid", ::getpid()},
                    {"ctrun_version", ending.identity().version},
                    {"entrypoint", config.entrypoint},
                    {"nproc_per_node", config.nproc_per_node},
                    {"nnodes", std::to_string(config.min_nodes) + ":" + std::to_string(config.max_nodes)},
                    {"node_rank", config.node_rank},
                    {"max_restarts", config.max_restarts},
                    {"max_run_time_s", config.max_run_time ? nlohmann::json(*config.max_run_time) : nlohmann::json(nullptr)}});
    ctx.events = events ? events.get() : &ctrun::NullEvents();
    return EndAfterRun(ending.Finish(ctrun::RunJob(config, ctx)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctrun: internal error: %s\n", e.what());
    return 1;
  }
}
