// train — data-parallel training of a small MLP under ctrun (or torchrun), the README demo.
//
// Each rank trains on its DistributedSampler shard of a deterministic synthetic dataset; gradients
// are averaged with one gloo all-reduce per step; every --snapshot-every steps each rank saves a
// snapshot (model, optimizer, LR scheduler, RNG, progress) to <snapshot-dir>/rank<R>. On a restart
// (TORCHELASTIC_RESTART_COUNT > 0, or any start that finds snapshots) the ranks agree on the newest
// snapshot they all hold and continue from it. The run is bit-deterministic: with or without
// failures the final parameters (--out) are identical, because every step seeds the RNG from
// (seed, epoch, step, rank), threads are fixed to one, and the all-reduce order is fixed.
//
// Failure injection (--fail-at-step S[,S2...] --fail-rank R[,R2...] [--fail-attempt A[,A2...]]):
// failure i happens on rank R_i when it is about to run global step S_i in attempt A_i (default:
// attempt i, so each restart gets past the previous failure).
//
// Warm starts: the entry point is train_main behind CTRUN_MAIN (ctrun/warm_main.h). Run directly,
// or under ctrun without --warm, it is an ordinary main; under ctrun --warm the binary is started
// once per job and every worker of every attempt is forked from it, skipping the dynamic loading
// of LibTorch. --timing prints unix_ns stamps of the start-up phases (train_main entered, process
// group ready, snapshot loaded, first step done; and the injected crash).
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "ctrun/torch_dist.h"
#include "ctrun/torch_snapshot.h"
#include "ctrun/warm_main.h"
#include "ctrun/worker.h"

namespace {

namespace cw = ctrun::worker;

struct Args {
  int epochs = 3;
  int batch_size = 16;  // per rank
  int dataset_size = 512;
  int features = 16;
  int hidden = 64;
  int classes = 4;
  double lr = 0.05;
  uint64_t seed = 1234;
  std::string snapshot_dir;
  int snapshot_every = 0;  // 0: never
  int keep = 3;
  bool sync_snapshot = false;
  int zstd = 0;
  std::vector<int64_t> fail_at_step;
  std::vector<int> fail_rank;
  std::vector<int> fail_attempt;
  std::string fail_mode = "throw";  // throw | abort | exit
  std::string out;
  int step_ms = 0;  // extra sleep per step, to pace demos and kill tests
  bool quiet = false;
  bool timing = false;
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int in, int hidden, int out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))),
        drop(register_module("drop", torch::nn::Dropout(0.1))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1->forward(x));
    x = drop->forward(x);
    x = torch::relu(fc2->forward(x));
    return fc3->forward(x);
  }
  torch::nn::Linear fc1, fc2, fc3;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Mlp);

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// --timing: one line per start-up phase, in train.py's format (bench/warm reads both).
void Stamp(const Args& a, const cw::LaunchEnv& env, const char* what, int64_t unix_ns = 0) {
  if (!a.timing) return;
  if (unix_ns == 0)
    unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
  std::fprintf(stderr, "[train] timing rank %d attempt %d %s unix_ns=%" PRId64 "\n", env.rank, env.restart_count,
               what, unix_ns);
}

// Progress bar on rank 0 only: '\r' redraws on a terminal, ~20 plain lines otherwise.
class Progress {
 public:
  Progress(int64_t total, bool enabled) : total_(total), enabled_(enabled), tty_(::isatty(1) != 0) {}
  void update(int64_t done, int64_t epoch, double loss) {
    if (!enabled_) return;
    const int64_t every = std::max<int64_t>(1, total_ / 20);
    if (!tty_ && done % every != 0 && done != total_) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(1, total_));
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::printf("%s[%s] step %" PRId64 "/%" PRId64 " epoch %" PRId64 " loss %.4f%s", tty_ ? "\r" : "",
                bar.c_str(), done, total_, epoch, loss, tty_ ? "" : "\n");
    if (tty_ && done == total_) std::printf("\n");
    std::fflush(stdout);
  }

 private:
  int64_t total_;
  bool enabled_;
  bool tty_;
};

// CUDA autocast: LibTorch 2.4 made the calls take the device type; the CUDA-only ones it kept
// are deprecated and warn on every call.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
void SetCudaAutocastDtype(at::ScalarType dtype) { at::autocast::set_autocast_dtype(at::kCUDA, dtype); }
void SetCudaAutocast(bool enabled) { at::autocast::set_autocast_enabled(at::kCUDA, enabled); }
#else
void SetCudaAutocastDtype(at::ScalarType dtype) { at::autocast::set_autocast_gpu_dtype(dtype); }
void SetCudaAutocast(bool enabled) { at::autocast::set_enabled(enabled); }
#endif

void MaybeFail(const Args& a, const cw::LaunchEnv& env, int64_t step) {
  for (size_t i = 0; i < a.fail_at_step.size(); ++i) {
    const int rank = i < a.fail_rank.size() ? a.fail_rank[i] : (a.fail_rank.empty() ? 0 : a.fail_rank.back());
    const int attempt = i < a.fail_attempt.size() ? a.fail_attempt[i] : static_cast<int>(i);
    if (a.fail_at_step[i] != step || rank != env.rank || attempt != env.restart_count) continue;
    std::fprintf(stderr, "[train] rank %d injecting failure at step %" PRId64 " (attempt %d) unix_ms=%" PRId64 "\n",
                 env.rank, step, env.restart_count, NowMs());
    Stamp(a, env, "crash");
    std::fflush(stderr);
    const std::string what = "injected failure at step " + std::to_string(step) + " on rank " +
                             std::to_string(env.rank);
    if (a.fail_mode == "abort") {
      cw::record_error("RuntimeError: " + what, cw::native_backtrace());
      std::abort();
    }
    if (a.fail_mode == "exit") {
      cw::record_error("RuntimeError: " + what, cw::native_backtrace());
      std::exit(3);
    }
    throw std::runtime_error(what);
  }
}

void WriteParams(const std::string& path, torch::nn::Module& m) {
  std::ofstream f(path, std::ios::trunc);
  static const char kHex[] = "0123456789abcdef";
  for (const auto& item : m.named_parameters()) {
    at::Tensor t = item.value().detach().contiguous().to(torch::kCPU);
    f << item.key() << " " << t.numel() << " ";
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    for (size_t i = 0; i < n; ++i) f << kHex[p[i] >> 4] << kHex[p[i] & 15];
    f << "\n";
  }
  if (!f) throw std::runtime_error("cannot write " + path);
}

int Train(const Args& a, int64_t started_ns) {
  const cw::LaunchEnv env = cw::LaunchEnv::from_env();
  Stamp(a, env, "start", started_ns);
  torch::set_num_threads(1);
  const bool cuda = torch::cuda::is_available();
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, env.local_rank) : torch::Device(torch::kCPU);
  // The rank's GPU is the current device for the whole run: NCCL's communicators, barrier and
  // the library's all_reduce_int use the current device, which is cuda:0 for every rank otherwise.
  const c10::DeviceGuard device_guard(device);
  cw::DistContext dist = cw::init_distributed(env);
  Stamp(a, env, "pg_ready");
  const bool leader = env.rank == 0;

  // The dataset: the same on every rank, from a fixed generator.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(a.seed);
  torch::Tensor x = torch::randn({a.dataset_size, a.features}, gen, torch::kFloat32);
  torch::Tensor teacher = torch::randn({a.features, a.classes}, gen, torch::kFloat32);
  torch::Tensor y = (x.matmul(teacher) + 0.5 * torch::randn({a.dataset_size, a.classes}, gen, torch::kFloat32))
                        .argmax(1);
  x = x.to(device);
  y = y.to(device);

  torch::manual_seed(a.seed);
  Mlp model(a.features, a.hidden, a.classes);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(0.9));
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/2, /*gamma=*/0.5);

  cw::DistributedSampler sampler(a.dataset_size, env.world_size, env.rank, /*shuffle=*/true, a.seed);
  const int64_t steps_per_epoch = (sampler.num_samples() + a.batch_size - 1) / a.batch_size;
  const int64_t total_steps = steps_per_epoch * a.epochs;

  std::optional<cw::SnapshotStore> store;
  if (!a.snapshot_dir.empty()) {
    cw::SnapshotOptions so;
    so.dir = a.snapshot_dir + "/rank" + std::to_string(env.rank);
    so.keep_last = a.keep;
    so.zstd_level = a.zstd;
    store.emplace(so);
  }
  cw::TrainState state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  state.scheduler = &scheduler;

  cw::TrainProgress progress;
  std::optional<cw::TrainProgress> resumed;
  if (store) resumed = cw::resume_training_snapshot(*store, state, dist.pg.get());
  if (resumed) {
    progress = *resumed;
  } else {
    cw::broadcast_parameters(*model, *dist.pg);  // as DDP does at construction
  }
  Stamp(a, env, "resumed");
  if (leader) {
    if (resumed) {
      std::printf("[train] attempt %d: resumed from snapshot at step %" PRId64 " (epoch %" PRId64 ")\n",
                  env.restart_count, progress.step, progress.epoch);
    } else {
      std::printf("[train] attempt %d: starting fresh: world %d, %" PRId64 " steps/epoch, %d epochs\n",
                  env.restart_count, env.world_size, steps_per_epoch, a.epochs);
    }
    std::fflush(stdout);
  }

  if (cuda) {  // mixed precision only with CUDA: bf16 autocast needs no loss scaling
    SetCudaAutocastDtype(at::kBFloat16);
  }
  Progress bar(total_steps, leader && !a.quiet);
  int64_t samples_this_attempt = 0;
  bool first_step = true;
  for (int64_t step = progress.step; step < total_steps; ++step) {
    const int64_t epoch = step / steps_per_epoch;
    const int64_t in_epoch = step % steps_per_epoch;
    MaybeFail(a, env, step);
    sampler.set_epoch(epoch);
    const std::vector<int64_t> mine = sampler.indices();  // cheap at this size
    const int64_t begin = in_epoch * a.batch_size;
    const int64_t end = std::min<int64_t>(begin + a.batch_size, static_cast<int64_t>(mine.size()));
    torch::Tensor idx = torch::from_blob(const_cast<int64_t*>(mine.data()) + begin, {end - begin}, torch::kInt64)
                            .clone()
                            .to(device);
    torch::manual_seed(a.seed * 1000003ULL + static_cast<uint64_t>(step) * 7919ULL +
                       static_cast<uint64_t>(env.rank));
    model->train();
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      SetCudaAutocast(cuda);
      loss = torch::nn::functional::cross_entropy(model->forward(x.index_select(0, idx)).to(torch::kFloat32),
                                                  y.index_select(0, idx));
      SetCudaAutocast(false);
      // As leaving Python's outermost torch.autocast does: the cast copies of the weights are
      // cached while autocast is on, and would be reused by every later forward, stale once
      // optimizer.step() has changed the weights. The graph for backward keeps its own.
      if (cuda) at::autocast::clear_cache();
    }
    loss.backward();
    cw::all_reduce_gradients(*model, *dist.pg);
    optimizer.step();
    if (in_epoch == steps_per_epoch - 1) scheduler.step();
    samples_this_attempt += end - begin;
    progress.samples_seen += end - begin;
    progress.step = step + 1;
    progress.epoch = progress.step / steps_per_epoch;
    ctrun::heartbeat(static_cast<uint64_t>(progress.step));  // the global step: the crash-loop guard compares it across restarts
    if (first_step) Stamp(a, env, "first_step");
    if (first_step && leader) {
      std::fprintf(stderr, "[train] attempt %d first step done unix_ms=%" PRId64 "\n", env.restart_count, NowMs());
    }
    first_step = false;
    bar.update(progress.step, epoch, loss.item<double>());
    if (store && a.snapshot_every > 0 && progress.step % a.snapshot_every == 0 && progress.step < total_steps) {
      cw::save_training_snapshot(*store, state, progress, /*async=*/!a.sync_snapshot);
    }
    if (a.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
  }
  if (store) store->wait();

  // Per-rank sample counts (load-imbalance check): gathered with one all-reduce.
  torch::Tensor counts = torch::zeros({2 * env.world_size}, torch::kInt64);
  counts[env.rank] = samples_this_attempt;
  counts[env.world_size + env.rank] = progress.samples_seen;
  std::vector<at::Tensor> bufs{counts.to(device)};  // NCCL reduces CUDA tensors only
  dist.pg->allreduce(bufs)->wait();
  counts = bufs[0].cpu();
  if (leader) {
    std::printf("[train] samples processed per rank (this attempt / all attempts):\n");
    for (int r = 0; r < env.world_size; ++r) {
      std::printf("[train]   rank %d: %" PRId64 " / %" PRId64 "\n", r, counts[r].item<int64_t>(),
                  counts[env.world_size + r].item<int64_t>());
    }
    if (!a.out.empty()) WriteParams(a.out, *model);
    std::printf("[train] done: %" PRId64 " steps, attempt %d\n", total_steps, env.restart_count);
    std::fflush(stdout);
  }
  // Keep rank 0 (the store host in worker-hosted mode) alive until everyone is done with it.
  dist.pg->barrier()->wait();
  return 0;
}

}  // namespace

int train_main(int argc, char** argv) {
  const int64_t started_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  cw::install_terminate_handler();
  Args a;
  CLI::App app{"ctrun example: deterministic data-parallel MLP training with snapshot/resume"};
  app.add_option("--epochs", a.epochs)->check(CLI::PositiveNumber);
  app.add_option("--batch-size", a.batch_size, "per rank")->check(CLI::PositiveNumber);
  app.add_option("--dataset-size", a.dataset_size)->check(CLI::PositiveNumber);
  app.add_option("--hidden", a.hidden)->check(CLI::PositiveNumber);
  app.add_option("--lr", a.lr);
  app.add_option("--seed", a.seed);
  app.add_option("--snapshot-dir", a.snapshot_dir);
  app.add_option("--snapshot-every", a.snapshot_every, "steps between snapshots (0: none)");
  app.add_option("--keep", a.keep, "snapshots kept per rank")->check(CLI::PositiveNumber);
  app.add_flag("--sync-snapshot", a.sync_snapshot, "save on the training thread (default: async)");
  app.add_option("--zstd", a.zstd, "zstd level for snapshots (0: off)");
  app.add_option("--fail-at-step", a.fail_at_step, "global step(s) at which to crash")->delimiter(',');
  app.add_option("--fail-rank", a.fail_rank, "rank(s) that crash")->delimiter(',');
  app.add_option("--fail-attempt", a.fail_attempt, "attempt(s) in which to crash (default: i-th failure in attempt i)")
      ->delimiter(',');
  app.add_option("--fail-mode", a.fail_mode)->check(CLI::IsMember({"throw", "abort", "exit"}));
  app.add_option("--out", a.out, "rank 0 writes the final parameters (hex) here");
  app.add_option("--step-ms", a.step_ms, "sleep per step (pacing for demos)");
  app.add_flag("--quiet", a.quiet, "no progress bar");
  app.add_flag("--timing", a.timing, "print unix_ns stamps of the start-up phases");
  CLI11_PARSE(app, argc, argv);
  return cw::run_recorded([&] { return Train(a, started_ns); });
}

CTRUN_MAIN(train_main)
