// ctrun: parse, check, run. The only place that catches exceptions (CLI11 and spdlog setup).
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "agent/launch_checks.h"
#include "agent/runner.h"
#include "agent/worker_env.h"
#include "cli/cli.h"
#include "cli/cluster_env.h"
#include "gpu/gpu_probe.h"
#include "gpu/nvml_driver.h"
#include "placement/job_placement.h"
#include "logs/logging.h"
#include "logs/output_plan.h"
#include "rendezvous/settings.h"
#include "sys/posix_util.h"

namespace {

int UsageError(const std::string& msg) {
  std::fprintf(stderr, "ctrun: error: %s\n", msg.c_str());
  return 2;
}

// 32 hex digits from the kernel's CSPRNG, like uuid4().hex.
std::string RandomRunId() {
  std::string id = ctrun::RandomHex(16);
  return id.empty() ? "standalone" : id;
}

int CpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv, argv + argc);
    // The environment is read once; everything below looks values up in it.
    const ctrun::Environment env = ctrun::Environment::FromProcess();
    const ctrun::EnvLookup lookup = ctrun::LookupIn(env);
    ctrun::CliOutcome cli = ctrun::ParseCommandLine(args, lookup);
    if (cli.action == ctrun::CliOutcome::Action::kExit) {
      std::fputs(cli.output.c_str(), stdout);
      std::fputs(cli.error.c_str(), stderr);
      return cli.exit_code;
    }
    ctrun::LaunchConfig config = std::move(cli.config);
    // torchrun --standalone picks a random run id; an explicit --rdzv_id is kept (ctrun extension).
    if (config.standalone && config.run_id == "none") config.run_id = RandomRunId();
    if (ctrun::Status s = ctrun::logs::SetupLogging(config.log_level); !s.ok()) return UsageError(s.message());
    const std::string* prefix_template = env.Get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    auto output_flags = ctrun::logs::ParseOutputFlags(config, prefix_template ? prefix_template->c_str() : nullptr);
    if (!output_flags.ok()) return UsageError(output_flags.message());

    // Under Slurm's srun with no node flags: nodes, node rank and master from SLURM_*.
    std::string cluster_notice;
    if (ctrun::Status s =
            ctrun::ApplyClusterEnv(&config, lookup, ctrun::DetectExplicitFlags(args, lookup), &cluster_notice);
        !s.ok())
      return UsageError(s.message());
    if (!cluster_notice.empty()) spdlog::info("{}", cluster_notice);

    ctrun::RunContext ctx;
    ctx.env = env;
    ctx.output_flags = std::move(output_flags.value());
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    ctx.hostname = host;

    if (ctrun::Status s = ctrun::rdzv::ResolveSettings(&config); !s.ok()) return UsageError(s.message());
    if (ctrun::Status s = ctrun::CheckSupported(config); !s.ok()) return UsageError(s.message());
    // NVML only where it can exist (the NVIDIA kernel driver is loaded) and is of use.
    std::unique_ptr<ctrun::GpuDriver> nvml = ctrun::WantsGpuDriver(config) ? ctrun::LoadNvml() : nullptr;
    auto gpus = ctrun::ProbeGpus(config, lookup, nvml.get(), &ctx.env);
    if (!gpus.ok()) return UsageError(gpus.message());
    if (ctrun::Status s = ctrun::ResolveNproc(&config, gpus.value(), CpuCount()); !s.ok()) return UsageError(s.message());
    if (ctrun::Status s = ctrun::CheckGpuFlags(config, ctx.env); !s.ok()) return UsageError(s.message());
    auto placement = ctrun::PlanJobPlacement(config, gpus.value(), ctx.env);
    if (!placement.ok()) return UsageError(placement.message());
    ctx.placement = std::move(placement.value());
    ctx.gpu_driver = nvml.get();
    if (nvml)
      for (const auto& d : gpus.value().devices) ctx.gpu_indices.push_back(d.index);
    auto executable = ctrun::ResolveEntrypoint(config, ctrun::FindPython(env), env);
    if (!executable.ok()) return UsageError(executable.message());
    ctx.executable = std::move(executable.value());
    if (std::string notice = ctrun::OmpNotice(config, env); !notice.empty()) spdlog::info("{}", notice);

    return ctrun::RunJob(config, ctx);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctrun: internal error: %s\n", e.what());
    return 1;
  }
}
