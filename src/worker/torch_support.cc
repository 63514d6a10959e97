// The LibTorch half of ctrun_worker (ctrun_worker_torch): process group from the launcher env,
// DistributedSampler, gradient all-reduce, training snapshots. One TU on purpose: LibTorch
// headers cost ~30-60 s per TU.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
// A Python wheel's LibTorch (torch/include of `pip install torch`) ships no gloo headers: there the
// gloo backend is refused at run time, with the reason, and NCCL still works.
#if __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define CTRUN_TORCH_HAS_GLOO 1
#else
#define CTRUN_TORCH_HAS_GLOO 0
#endif
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef CTRUN_TORCH_HAS_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <type_traits>

#include "ctrun/torch_dist.h"
#include "ctrun/torch_snapshot.h"
#include "ctrun/warm_main.h"

namespace ctrun::worker {

// ---------------------------------------------------------------------------------------------
// Process group

namespace {

#if TORCH_VERSION_MAJOR >= 2
// LibTorch 2.x: ProcessGroupGloo and ProcessGroupNCCL are c10d::Backend objects, not process groups.
// A c10d::ProcessGroup sends each collective to the backend registered for its tensors' device, as
// torch.distributed.init_process_group assembles it: gloo for CPU and CUDA tensors, NCCL for CUDA
// tensors only (a CPU tensor is refused, as ProcessGroupNCCL refused it in 1.13). The group's own
// constructor took an Options (backend name, timeout) in early 2.x and later takes none, the
// default backend then being set with setDefaultBackend; the template uses whichever this LibTorch
// has (the branch not taken is never instantiated). barrier() and getBackendType() read that
// default backend.
template <typename PG = c10d::ProcessGroup>
c10::intrusive_ptr<c10d::ProcessGroup> WrapBackend(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnv& env,
                                                   typename PG::BackendType type, const std::string& name,
                                                   std::chrono::milliseconds timeout,
                                                   const c10::intrusive_ptr<c10d::Backend>& backend,
                                                   std::initializer_list<c10::DeviceType> devices) {
  c10::intrusive_ptr<PG> pg;
  if constexpr (std::is_constructible_v<PG, c10::intrusive_ptr<c10d::Store>, int, int>) {
    pg = c10::make_intrusive<PG>(store, env.rank, env.world_size);
    pg->setDefaultBackend(type);
  } else {
    pg = c10::make_intrusive<PG>(store, env.rank, env.world_size,
                                 c10::make_intrusive<typename PG::Options>(name, timeout));
  }
  for (const c10::DeviceType device : devices) pg->setBackend(device, type, backend);
  return pg;
}
#endif

}  // namespace

c10::intrusive_ptr<c10d::Store> make_store(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = env.master_port;
  opts.isServer = env.hosts_store();
  opts.numWorkers = static_cast<size_t>(env.world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  opts.multiTenant = true;
  auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  if (env.use_agent_store) {
    return c10::make_intrusive<c10d::PrefixStore>(env.attempt_prefix(), tcp);
  }
  return tcp;
}

DistContext init_distributed(const LaunchEnv& env, const DistOptions& options) {
  DistContext ctx;
  ctx.env = env;
  ctx.store = make_store(env, options.timeout);
  auto pg_store = c10::make_intrusive<c10d::PrefixStore>("default_pg/", ctx.store);
  std::string backend = options.backend;
  if (backend == "auto") backend = torch::cuda::is_available() ? "nccl" : "gloo";
  if (backend == "nccl") {
#ifdef CTRUN_TORCH_HAS_NCCL
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = options.timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(pg_store, env.rank, env.world_size, opts);
#if TORCH_VERSION_MAJOR >= 2
    ctx.pg = WrapBackend(pg_store, env, c10d::ProcessGroup::BackendType::NCCL, "nccl", options.timeout, nccl,
                         {c10::DeviceType::CUDA});
#else
    ctx.pg = std::move(nccl);
#endif
    ctx.backend = "nccl";
    return ctx;
#else
    if (options.backend == "nccl") {
      throw std::runtime_error("ctrun::worker: LibTorch was built without NCCL; use backend gloo");
    }
    backend = "gloo";  // CUDA without NCCL in this LibTorch: gloo still works on CPU tensors
#endif
  }
  if (backend != "gloo") throw std::runtime_error("ctrun::worker: unknown backend '" + backend + "'");
#if !CTRUN_TORCH_HAS_GLOO
  throw std::runtime_error(
      "ctrun::worker: this LibTorch has no gloo headers (a Python wheel's LibTorch ships none), so the gloo "
      "backend was left out at build time; use backend nccl on GPUs, or build against a LibTorch with gloo");
#else
  auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  if (options.gloo_threads < 1)
    throw std::invalid_argument("ctrun::worker: DistOptions.gloo_threads must be at least 1, not " +
                                std::to_string(options.gloo_threads));
  opts->threads = options.gloo_threads;
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(pg_store, env.rank, env.world_size, opts);
#if TORCH_VERSION_MAJOR >= 2
  ctx.pg = WrapBackend(pg_store, env, c10d::ProcessGroup::BackendType::GLOO, "gloo", options.timeout, gloo,
                       {c10::DeviceType::CPU, c10::DeviceType::CUDA});
#else
  ctx.pg = std::move(gloo);
#endif
  ctx.backend = "gloo";
  return ctx;
#endif
}

int64_t all_reduce_int(c10d::ProcessGroup& pg, int64_t value, c10d::ReduceOp op) {
  at::Tensor v = torch::tensor({value}, torch::kInt64);
#ifdef CTRUN_TORCH_HAS_NCCL
  // NCCL reduces CUDA tensors only ("Tensors must be CUDA and dense"): the value travels on the
  // current device, the one the rank chose (torch.cuda.set_device / c10::cuda::set_device).
#if TORCH_VERSION_MAJOR >= 2
  const bool nccl = pg.getBackendType() == c10d::ProcessGroup::BackendType::NCCL;  // pg wraps the backend
#else
  const bool nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(&pg) != nullptr;
#endif
  if (nccl) v = v.to(torch::Device(torch::kCUDA));
#endif
  std::vector<at::Tensor> t{v};
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  pg.allreduce(t, o)->wait();
  return t[0].item<int64_t>();
}

// ---------------------------------------------------------------------------------------------
// Sampler: torch/utils/data/distributed.py, same arithmetic and the same randperm stream.

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: rank must be in [0, num_replicas)");
  }
  if (dataset_size < 0) throw std::invalid_argument("DistributedSampler: negative dataset size");
  if (drop_last_ && dataset_size_ % num_replicas_ != 0) {
    num_samples_ = (dataset_size_ - num_replicas_ + num_replicas_ - 1) / num_replicas_;  // ceil
  } else {
    num_samples_ = (dataset_size_ + num_replicas_ - 1) / num_replicas_;
  }
  total_size_ = num_samples_ * num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> idx(static_cast<size_t>(dataset_size_));
  if (shuffle_) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    at::Tensor perm = torch::randperm(dataset_size_, gen, torch::kInt64);
    std::memcpy(idx.data(), perm.data_ptr<int64_t>(), idx.size() * sizeof(int64_t));
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) idx[static_cast<size_t>(i)] = i;
  }
  if (!drop_last_) {
    const size_t n = idx.size();
    for (size_t i = 0; n > 0 && idx.size() < static_cast<size_t>(total_size_); ++i) idx.push_back(idx[i % n]);
  } else {
    idx.resize(static_cast<size_t>(total_size_));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total_size_; i += num_replicas_) mine.push_back(idx[static_cast<size_t>(i)]);
  return mine;
}

// ---------------------------------------------------------------------------------------------
// Gradients

void all_reduce_gradients(torch::nn::Module& module, c10d::ProcessGroup& pg) {
  std::vector<at::Tensor> params;
  for (auto& p : module.parameters())
    if (p.requires_grad()) params.push_back(p);  // a frozen parameter has no gradient to average
  if (params.empty()) return;
  // The gradients, then one "defined here" flag per parameter: a parameter no rank used keeps
  // an undefined gradient (an optimizer then leaves it alone), as under DDP.
  std::vector<at::Tensor> flat_parts;
  flat_parts.reserve(params.size() + 1);
  std::vector<float> defined;
  defined.reserve(params.size());
  for (auto& p : params) {
    const bool d = p.grad().defined();
    defined.push_back(d ? 1.0f : 0.0f);
    flat_parts.push_back(d ? p.grad().detach().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  flat_parts.push_back(torch::tensor(defined, params[0].options().dtype(torch::kFloat32)).to(params[0].dtype()));
  std::vector<at::Tensor> bufs{torch::cat(flat_parts)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  pg.allreduce(bufs, o)->wait();
  const int64_t grads = bufs[0].numel() - static_cast<int64_t>(params.size());
  const at::Tensor used = bufs[0].narrow(0, grads, static_cast<int64_t>(params.size())).to(torch::kCPU);
  at::Tensor sums = bufs[0].narrow(0, 0, grads);
  sums.div_(pg.getSize());
  int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    const int64_t n = p.numel();
    if (used[static_cast<int64_t>(i)].item<double>() > 0) {
      at::Tensor slice = sums.narrow(0, offset, n).view(p.sizes());
      if (p.grad().defined()) {
        p.mutable_grad().copy_(slice);
      } else {
        p.mutable_grad() = slice.clone();
      }
    }
    offset += n;
  }
}

void broadcast_parameters(torch::nn::Module& module, c10d::ProcessGroup& pg) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors = module.parameters();
  for (auto& b : module.buffers()) tensors.push_back(b);
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t.detach()};
    pg.broadcast(one)->wait();
  }
}

// ---------------------------------------------------------------------------------------------
// Snapshots

namespace {

// LRScheduler keeps its step count protected; a pointer-to-member formed inside a derived class
// reads it from any scheduler without a cast (well-defined access, not a layout hack).
struct SchedulerAccess : torch::optim::LRScheduler {
  static unsigned torch::optim::LRScheduler::*StepCount() { return &SchedulerAccess::step_count_; }
};

int64_t ReadInt(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}

std::string ShapeText(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// Why `saved` (read from the archive under `name`) cannot be loaded into `current`, or empty.
std::string TensorMismatch(const std::string& name, const at::Tensor& saved, const at::Tensor& current) {
  if (saved.sizes() != current.sizes()) {
    return "size mismatch for " + name + ": shape " + ShapeText(saved.sizes()) + " in the snapshot, " +
           ShapeText(current.sizes()) + " in the model";
  }
  if (saved.scalar_type() != current.scalar_type()) {
    return "dtype mismatch for " + name + ": " + std::string(c10::toString(saved.scalar_type())) +
           " in the snapshot, " + std::string(c10::toString(current.scalar_type())) + " in the model";
  }
  return {};
}

// Module::load replaces each tensor with the archived one (Tensor::set_) whatever its shape, and
// ignores what the archive holds beyond the model, so a snapshot of another model would load
// silently. This walks the module tree as Module::load does (own parameters, own buffers, then
// each serializable child's sub-archive) and throws SnapshotError for the first tensor that is
// missing or differs in shape or dtype, and for an entry of the archive that the level has no
// parameter, buffer or serializable child of that name for (Module::save writes nothing else;
// Python's load_state_dict reports it as an unexpected key), before anything is changed. Names
// are dotted paths ("fc1.weight"), as in named_parameters().
void CheckFits(const torch::nn::Module& module, torch::serialize::InputArchive& archive, const std::string& prefix) {
  auto check = [&](const std::string& key, const at::Tensor& current, bool is_buffer) {
    at::Tensor saved;  // undefined: try_read hands over the archived tensor without touching ours
    if (!archive.try_read(key, saved, is_buffer)) {
      throw SnapshotError("snapshot does not fit the model: it has no " +
                          std::string(is_buffer ? "buffer " : "parameter ") + prefix + key);
    }
    if (std::string why = TensorMismatch(prefix + key, saved, current); !why.empty())
      throw SnapshotError("snapshot does not fit the model: " + why);
  };
  std::set<std::string> expected;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    check(p.key(), p.value(), false);
    expected.insert(p.key());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    check(b.key(), b.value(), true);
    expected.insert(b.key());
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    expected.insert(child.key());
    torch::serialize::InputArchive sub;
    if (!archive.try_read(child.key(), sub))
      throw SnapshotError("snapshot does not fit the model: it has no module " + prefix + child.key());
    CheckFits(*child.value(), sub, prefix + child.key() + ".");
  }
  // What the model lacks comes last: a snapshot of an unrelated model is reported by what it
  // does not have, as before.
  for (const std::string& key : archive.keys()) {
    if (expected.count(key) != 0) continue;
    c10::IValue entry;
    (void)archive.try_read(key, entry);
    const char* kind = entry.isTensor() ? "tensor " : entry.isObject() ? "module " : "entry ";
    throw SnapshotError("snapshot does not fit the model: unexpected " + std::string(kind) + prefix + key +
                        " in the snapshot");
  }
}

// Where a snapshot's tensors are loaded: the device of the model's parameters and buffers when
// they are all on one (CPU when it has none), so that they land there whatever device they were
// saved from (a job resumed with another GPU mapping would otherwise load rank 5's tensors on
// the cuda:1 it saved from, and Module::load moves a parameter to its tensor's device). A model
// spread over several devices gets nullopt: each tensor comes back where it was saved.
std::optional<torch::Device> LoadDevice(const torch::nn::Module& model) {
  std::optional<torch::Device> device;
  auto see = [&](const at::Tensor& t) {
    if (!device) device = t.device();
    return *device == t.device();
  };
  for (const auto& p : model.parameters())
    if (!see(p)) return std::nullopt;
  for (const auto& b : model.buffers())
    if (!see(b)) return std::nullopt;
  return device.value_or(torch::Device(torch::kCPU));
}

}  // namespace

std::vector<std::byte> serialize_training_state(const TrainState& state, const TrainProgress& progress) {
  if (state.model == nullptr) throw std::invalid_argument("TrainState::model is null");
  torch::serialize::OutputArchive root;
  torch::serialize::OutputArchive model;
  state.model->save(model);
  root.write("model", model);
  if (state.optimizer) {
    torch::serialize::OutputArchive opt;
    state.optimizer->save(opt);
    root.write("optimizer", opt);
    // LibTorch 1.13's Optimizer::load reads the saved param groups but restores only the
    // per-parameter state (optim/serialize.h), so a decayed learning rate would silently reset:
    // keep each group's lr ourselves.
    std::vector<double> lrs;
    for (auto& g : state.optimizer->param_groups()) lrs.push_back(g.options().get_lr());
    root.write("optimizer_lrs", torch::tensor(lrs, torch::kFloat64));
  }
  if (state.scheduler) {
    root.write("scheduler_step_count",
               c10::IValue(static_cast<int64_t>(state.scheduler->*SchedulerAccess::StepCount())));
  }
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    root.write("rng_cpu", gen.get_state());
  }
  root.write("progress.epoch", c10::IValue(progress.epoch));
  root.write("progress.step", c10::IValue(progress.step));
  root.write("progress.samples_seen", c10::IValue(progress.samples_seen));
  if (state.save_extra) {
    torch::serialize::OutputArchive extra;
    state.save_extra(extra);
    root.write("extra", extra);
  }
  std::vector<std::byte> out;
  root.save_to([&out](const void* data, size_t n) -> size_t {
    const auto* p = static_cast<const std::byte*>(data);
    out.insert(out.end(), p, p + n);
    return n;
  });
  return out;
}

TrainProgress deserialize_training_state(const TrainState& state, const std::vector<std::byte>& bytes) {
  if (state.model == nullptr) throw std::invalid_argument("TrainState::model is null");
  torch::serialize::InputArchive root;
  const std::optional<torch::Device> device = LoadDevice(*state.model);
  // The optional's type is not named: c10::optional in 1.13, std::optional later.
  const auto* data = reinterpret_cast<const char*>(bytes.data());
  if (device) {
    root.load_from(data, bytes.size(), *device);
  } else {
    root.load_from(data, bytes.size());
  }
  torch::serialize::InputArchive model;
  root.read("model", model);
  CheckFits(*state.model, model, "");  // throws before anything is loaded
  state.model->load(model);
  if (state.optimizer) {
    torch::serialize::InputArchive opt;
    root.read("optimizer", opt);
    state.optimizer->load(opt);
    at::Tensor lrs;
    root.read("optimizer_lrs", lrs);
    auto& groups = state.optimizer->param_groups();
    if (lrs.numel() != static_cast<int64_t>(groups.size())) {
      throw std::runtime_error("snapshot has " + std::to_string(lrs.numel()) + " optimizer param groups, model has " +
                               std::to_string(groups.size()));
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      groups[i].options().set_lr(lrs[static_cast<int64_t>(i)].item<double>());
    }
  }
  if (state.scheduler) {
    state.scheduler->*SchedulerAccess::StepCount() =
        static_cast<unsigned>(ReadInt(root, "scheduler_step_count"));
  }
  at::Tensor rng;
  root.read("rng_cpu", rng);
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the global generator
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.to(torch::kCPU));  // loaded on the model's device with the rest
  }
  TrainProgress p;
  p.epoch = ReadInt(root, "progress.epoch");
  p.step = ReadInt(root, "progress.step");
  p.samples_seen = ReadInt(root, "progress.samples_seen");
  if (state.load_extra) {
    torch::serialize::InputArchive extra;
    root.read("extra", extra);
    state.load_extra(extra);
  }
  return p;
}

void save_training_snapshot(SnapshotStore& store, const TrainState& state, const TrainProgress& progress,
                            bool async) {
  std::vector<std::byte> bytes = serialize_training_state(state, progress);
  if (async) {
    store.save_async(static_cast<uint64_t>(progress.step), std::move(bytes));
  } else {
    store.save(static_cast<uint64_t>(progress.step), bytes);
  }
}

std::optional<TrainProgress> resume_training_snapshot(SnapshotStore& store, const TrainState& state,
                                                      c10d::ProcessGroup* pg) {
  store.wait();
  std::optional<uint64_t> bound;  // only steps <= bound are candidates
  for (;;) {
    LoadResult mine = store.load_latest(bound);
    for (const std::string& s : mine.skipped) std::fprintf(stderr, "ctrun::worker: skipping snapshot %s\n", s.c_str());
    const int64_t proposal = mine.snapshot ? static_cast<int64_t>(mine.snapshot->step) : -1;
    const int64_t agreed =
        pg ? all_reduce_int(*pg, proposal, c10d::ReduceOp::MIN) : proposal;
    if (agreed < 0) {  // some rank has nothing loadable: start fresh together
      store.discard_newer(std::nullopt);
      return std::nullopt;
    }
    // Does this rank hold a valid snapshot at exactly `agreed`? (proposal >= agreed always.)
    std::optional<Snapshot> candidate;
    if (mine.snapshot && mine.snapshot->step == static_cast<uint64_t>(agreed)) {
      candidate = std::move(mine.snapshot);
    } else {
      LoadResult older = store.load_latest(static_cast<uint64_t>(agreed));
      if (older.snapshot && older.snapshot->step == static_cast<uint64_t>(agreed)) {
        candidate = std::move(older.snapshot);
      }
    }
    const int64_t have = candidate ? 1 : 0;
    const int64_t all_have = pg ? all_reduce_int(*pg, have, c10d::ReduceOp::MIN) : have;
    if (all_have == 1) {
      // A snapshot of another model (shapes, dtypes) is not loaded and not skipped: falling back
      // to an older one or a fresh start would let the next save remove it (a save supersedes
      // newer steps), so the caller must decide (another snapshot directory, or the right model).
      TrainProgress progress;
      try {
        progress = deserialize_training_state(state, candidate->data);
      } catch (const SnapshotError& e) {
        throw SnapshotError(candidate->path + ": " + e.what());
      }
      store.discard_newer(static_cast<uint64_t>(agreed));
      return progress;
    }
    // Some rank lacks `agreed` (kept fewer, or its copy is corrupt): look below it.
    if (agreed == 0) {
      store.discard_newer(std::nullopt);
      return std::nullopt;
    }
    bound = static_cast<uint64_t>(agreed - 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Warm starts (ctrun/warm_main.h)

// A fresh process seeds the default generator from fresh entropy when it first uses it; a worker
// forked from the warm server would otherwise share the server's generator (created there if a
// static initialiser drew a random number) with every rank and attempt.
void torch_warm_child() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(c10::detail::getNonDeterministicRandom());
}

}  // namespace ctrun::worker
