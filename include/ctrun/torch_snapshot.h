// ctrun/torch_snapshot.h — one-file training snapshots (model, optimizer, LR scheduler, RNG,
// epoch/step) through a SnapshotStore, and a resume on which all ranks agree.
//
// Contract
//  - serialize_training_state() writes one torch::serialize archive holding: "model" (parameters
//    and buffers), "optimizer" (Optimizer::save) plus "optimizer_lrs" (each param group's lr,
//    restored explicitly because LibTorch 1.13's Optimizer::load does not restore group options),
//    "scheduler_step_count" (for any torch::optim::LRScheduler), "rng_cpu" (the default CPU
//    generator state), "progress" (epoch, step, samples_seen) and an optional user archive
//    "extra". deserialize_training_state() restores all of them in place and returns the progress.
//    Before it loads anything it checks every parameter and buffer of the model against the
//    snapshot (as Python's load_state_dict does, strictly): a tensor that is missing or whose shape
//    or dtype differs throws SnapshotError, e.g. "snapshot does not fit the model: size mismatch
//    for fc1.weight: shape [64, 4] in the snapshot, [32, 4] in the model", and so does a tensor
//    or module of the snapshot that the model lacks ("snapshot does not fit the model: unexpected
//    module fc2 in the snapshot", Python's "Unexpected key(s)"); the model is left as it was. (LibTorch's Module::load alone would replace the tensors whatever their shape.)
//    The snapshot's tensors (model, optimizer state, "extra") are loaded onto the device the
//    model's parameters and buffers are on (CPU for a model without any), not the device they
//    were saved from: a job resumed with another GPU mapping keeps each rank's model on the
//    device it chose. A model spread over several devices has each tensor loaded where it was
//    saved. load_extra gets its tensors on that device too (as torch.load with map_location
//    does): a tensor that must live on the CPU, such as a generator's state for set_state, is
//    moved back with .to(torch::kCPU) there (the library does so for its own "rng_cpu").
//  - save_training_snapshot(store, state, progress, async): serializes on the calling thread (the
//    only part that must see a consistent model), then hands the bytes to the store, in the
//    background when async (see SnapshotStore::save_async for the at-most-one-in-flight rule).
//    The snapshot's step is progress.step.
//  - resume_training_snapshot(store, state, pg): every rank proposes the newest step it can load;
//    the ranks all-reduce MIN, each checks it holds a valid snapshot at that exact step, and they
//    repeat with lower bounds until all hold the same step (or none: fresh start, nullopt). Ranks
//    with newer snapshots (a crash between ranks' saves) thus fall back to the common one, and
//    remove their newer ones (valid or not) before it returns (SnapshotStore::discard_newer;
//    on a fresh start every rank removes all of its snapshots): kept, a newer step could be
//    agreed on later after a save of it that only some ranks finished, and the ranks would resume
//    from different runs. All ranks must call it collectively. With pg == nullptr it just loads
//    the newest valid one (and removes the newer, invalid ones).
//    An agreed snapshot that does not fit the model is not loaded: the SnapshotError above is
//    rethrown with the snapshot's path in front (no fallback to an older snapshot or a fresh
//    start, whose next save would remove it). Ranks with the same model all throw.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "ctrun/snapshot_store.h"

namespace ctrun::worker {

struct TrainProgress {
  int64_t epoch = 0;         // epoch to run next (or being run)
  int64_t step = 0;          // global optimizer steps done
  int64_t samples_seen = 0;  // by this rank, all attempts together
};

struct TrainState {
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;          // optional
  torch::optim::LRScheduler* scheduler = nullptr;        // optional
  std::function<void(torch::serialize::OutputArchive&)> save_extra;  // optional
  std::function<void(torch::serialize::InputArchive&)> load_extra;   // optional
};

std::vector<std::byte> serialize_training_state(const TrainState& state, const TrainProgress& progress);
TrainProgress deserialize_training_state(const TrainState& state, const std::vector<std::byte>& bytes);

void save_training_snapshot(SnapshotStore& store, const TrainState& state, const TrainProgress& progress,
                            bool async);
std::optional<TrainProgress> resume_training_snapshot(SnapshotStore& store, const TrainState& state,
                                                      c10d::ProcessGroup* pg);

}  // namespace ctrun::worker
