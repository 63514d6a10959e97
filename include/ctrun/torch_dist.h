// ctrun/torch_dist.h — LibTorch helpers for data-parallel training under ctrun or torchrun
// (target ctrun::worker_torch; built only when LibTorch is found).
//
// Contract
//  - make_store(env): the c10d store the launcher environment describes, exactly as torch 1.13's
//    env:// rendezvous builds it. TORCHELASTIC_USE_AGENT_STORE=True: every rank is a TCPStore
//    client of MASTER_ADDR:MASTER_PORT (the agent hosts it) and the store is wrapped in
//    PrefixStore("/worker/attempt_<restart_count>") so keys of earlier attempts never collide.
//    Otherwise rank 0 hosts a multi-tenant TCPStore server on MASTER_PORT and the others connect.
//    As in torch 1.13: a client retries its connection until `timeout` and then throws; once
//    connected, every rank checks in (increments the store's init key), and the rank hosting the
//    server then waits until all WORLD_SIZE ranks have checked in, or until `timeout` has passed,
//    and RETURNS either way (no throw: a rank that never came shows up later, as a timeout of the
//    process group's first collective). Clients do not wait for the other ranks.
//  - init_distributed(env): make_store + a process group over PrefixStore("default_pg/", store):
//    gloo (tensors on CPU), or NCCL when LibTorch was built with it and CUDA is available
//    (backend "auto"). Throws c10::Error / std::runtime_error on failure. With LibTorch 2.x, where
//    ProcessGroupGloo and ProcessGroupNCCL are c10d::Backend objects, pg is a c10d::ProcessGroup
//    over that backend (gloo registered for CPU and CUDA tensors, NCCL for CUDA tensors), as
//    init_process_group builds it; with 1.13 it is the ProcessGroupGloo / ProcessGroupNCCL itself.
//    Built against a LibTorch without gloo headers (a Python wheel's torch/include ships none),
//    the gloo backend is left out: asking for it (or "auto" without CUDA and NCCL) throws
//    std::runtime_error naming why.
//  - DistributedSampler: torch.utils.data.DistributedSampler's index math, bit for bit: the same
//    torch.randperm(n, generator seeded seed+epoch) permutation, padding by repeating the head of
//    the list (or dropping the tail with drop_last), then every world_size-th index from rank.
//  - all_reduce_gradients(module, pg): averages the gradients of the parameters that require one
//    across ranks with ONE all-reduce over a flat buffer in parameters() order, so the reduction
//    order, and thus the result, is deterministic and identical on every rank. As under DDP: a
//    frozen parameter (requires_grad false) is left alone; a gradient undefined on some ranks
//    counts as zeros there; one undefined on every rank (a parameter no rank used) stays
//    undefined, so an optimizer (weight decay included) does not touch it. Every rank must have
//    the same parameters requiring gradients.
//    broadcast_parameters(module, pg) copies rank 0's parameters and buffers to all ranks.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ctrun/launch_env.h"

namespace ctrun::worker {

struct DistOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string backend = "auto";  // "auto", "gloo", "nccl"
  int gloo_threads = 2;
};

struct DistContext {
  LaunchEnv env;
  c10::intrusive_ptr<c10d::Store> store;         // attempt-scoped store
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::string backend;                           // "gloo" or "nccl"
  int rank() const { return env.rank; }
  int world_size() const { return env.world_size; }
};

c10::intrusive_ptr<c10d::Store> make_store(const LaunchEnv& env, std::chrono::milliseconds timeout);
DistContext init_distributed(const LaunchEnv& env, const DistOptions& options = {});

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  int64_t num_samples() const { return num_samples_; }  // per rank, every epoch
  std::vector<int64_t> indices() const;                 // this rank's indices for epoch()

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_ = 0;
  int64_t total_size_ = 0;
};

void all_reduce_gradients(torch::nn::Module& module, c10d::ProcessGroup& pg);
void broadcast_parameters(torch::nn::Module& module, c10d::ProcessGroup& pg);
// A min/max/sum all-reduce of one int64 (for agreeing on a step, counting samples). With NCCL the
// value travels on the current CUDA device (set it per rank first, as for any NCCL collective).
int64_t all_reduce_int(c10d::ProcessGroup& pg, int64_t value, c10d::ReduceOp op);

}  // namespace ctrun::worker
