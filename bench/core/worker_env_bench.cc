// What preparing one attempt's workers costs the agent before any clone: each rank's plan
// (PlanRank: argv and the whole environment) flattened into the KEY=VALUE entries a spawn takes,
// as Agent::StartAttempt does. The environment is a typical login's (48 variables, 40-byte
// values) unless CTRUN_BENCH_REAL_ENV=1 takes this process's own.
//   bench/core/ctrun_worker_env_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "agent/rank_plan.h"

namespace {

ctrun::Environment BaseEnv() {
  if (const char* real = std::getenv("CTRUN_BENCH_REAL_ENV"); real && std::string(real) == "1")
    return ctrun::Environment::FromProcess();
  std::vector<std::string> entries;
  for (int i = 0; i < 48; ++i) entries.push_back("SOME_VARIABLE_" + std::to_string(i) + "=" + std::string(40, 'v'));
  return ctrun::Environment::FromEntries(entries);
}

void BM_PlanAttempt(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  ctrun::LaunchConfig config;
  config.nproc_per_node = n;
  const ctrun::Environment base = BaseEnv();
  ctrun::AttemptInfo attempt;
  attempt.master_addr = "127.0.0.1";
  attempt.master_port = 29500;
  for (int i = 0; i < n; ++i)
    attempt.error_files.push_back("/tmp/torchelastic_abcdefgh/none_ijklmnop/attempt_0/" + std::to_string(i) + "/error.json");
  for (auto _ : state) {
    for (int i = 0; i < n; ++i) {
      const ctrun::RankInfo rank = ctrun::RankFor(config, i, std::nullopt);
      ctrun::RankPlan plan = ctrun::PlanRank(config, base, "/usr/bin/train", rank, attempt);
      std::vector<std::string> env = plan.env.Entries();
      benchmark::DoNotOptimize(env.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_PlanAttempt)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
