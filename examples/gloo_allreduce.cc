// gloo_allreduce — the smallest LibTorch check of a launcher: build the gloo process group from
// the environment (agent store or worker-hosted store, as torch 1.13's env:// does), all-reduce a
// tensor of ones, and exit 0 iff every element equals WORLD_SIZE (1 otherwise).
#include <torch/torch.h>

#include <cstdio>

#include "ctrun/torch_dist.h"
#include "ctrun/worker.h"

int main() {
  namespace cw = ctrun::worker;
  cw::install_terminate_handler();
  return cw::run_recorded([] {
    const cw::LaunchEnv env = cw::LaunchEnv::from_env();
    torch::set_num_threads(1);
    cw::DistOptions opts;
    opts.backend = "gloo";
    opts.timeout = std::chrono::seconds(60);
    cw::DistContext dist = cw::init_distributed(env, opts);
    std::vector<at::Tensor> t{torch::ones({1024}, torch::kFloat32)};
    dist.pg->allreduce(t)->wait();
    const bool ok = torch::all(t[0] == static_cast<float>(env.world_size)).item<bool>();
    std::printf("gloo_allreduce rank %d/%d (agent store: %s, attempt %d): sum %s world size\n", env.rank,
                env.world_size, env.use_agent_store ? "yes" : "no", env.restart_count, ok ? "==" : "!=");
    std::fflush(stdout);
    dist.pg->barrier()->wait();  // rank 0 may host the store: leave together
    return ok ? 0 : 1;
  });
}
