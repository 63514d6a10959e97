// LibTorch helpers: DistributedSampler parity with torch's Python sampler, training-state
// round trip, and the resume agreement across ranks (two in-process gloo ranks over a HashStore).
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "ctrun/torch_dist.h"
#include "ctrun/torch_snapshot.h"
#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using ctrun::testing::RunCommand;
using ctrun::testing::TempDir;

TEST(DistributedSampler, MatchesTorchPythonSamplerBitForBit) {
  struct Case { int64_t n; int world; bool shuffle; bool drop_last; uint64_t seed; int64_t epoch; };
  const std::vector<Case> cases{{10, 3, true, false, 0, 0}, {10, 3, true, true, 7, 2}, {512, 2, true, false, 1234, 1},
                                {5, 4, false, false, 0, 0}, {2, 5, true, false, 3, 0}, {11, 4, false, true, 0, 0}};
  std::string py = "import sys\nfrom torch.utils.data.distributed import DistributedSampler\n";
  std::string expected;
  for (const auto& c : cases) {
    for (int r = 0; r < c.world; ++r) {
      std::ostringstream s;
      s << "s = DistributedSampler(range(" << c.n << "), num_replicas=" << c.world << ", rank=" << r
        << ", shuffle=" << (c.shuffle ? "True" : "False") << ", seed=" << c.seed
        << ", drop_last=" << (c.drop_last ? "True" : "False") << ")\ns.set_epoch(" << c.epoch
        << ")\nprint(len(s), ','.join(map(str, list(s))))\n";
      py += s.str();
      DistributedSampler mine(c.n, c.world, r, c.shuffle, c.seed, c.drop_last);
      mine.set_epoch(c.epoch);
      std::ostringstream e;
      e << mine.num_samples() << " ";
      auto idx = mine.indices();
      for (size_t i = 0; i < idx.size(); ++i) e << (i ? "," : "") << idx[i];
      expected += e.str() + "\n";
    }
  }
  auto r = RunCommand({"/usr/bin/python3", "-c", py}, {}, std::chrono::seconds(60));
  if (r.exit_code != 0 && r.err.find("No module named 'torch'") != std::string::npos) {
    GTEST_SKIP() << "Debian python3-torch not installed";
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected);
}

struct Net : torch::nn::Module {
  Net() : fc(register_module("fc", torch::nn::Linear(4, 3))) {}
  torch::nn::Linear fc;
};

void TrainOneStep(Net& net, torch::optim::SGD& opt) {
  opt.zero_grad();
  net.fc->forward(torch::randn({8, 4})).pow(2).sum().backward();
  opt.step();
}

TEST(TrainingSnapshot, RoundTripRestoresModelOptimizerSchedulerRngAndProgress) {
  torch::manual_seed(1);
  Net a;
  torch::optim::SGD opt_a(a.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::StepLR sched_a(opt_a, 1, 0.5);
  TrainOneStep(a, opt_a);
  sched_a.step();  // LibTorch's StepLR decays on its 2nd step() (count 1), unlike Python's
  sched_a.step();
  ASSERT_DOUBLE_EQ(opt_a.param_groups()[0].options().get_lr(), 0.05);
  TrainState sa{&a, &opt_a, &sched_a};
  TrainProgress p{3, 17, 1234};
  std::vector<std::byte> bytes = serialize_training_state(sa, p);
  const at::Tensor expected_next = torch::randn({5});  // what the RNG yields after the snapshot

  torch::manual_seed(99);
  Net b;
  torch::optim::SGD opt_b(b.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::StepLR sched_b(opt_b, 1, 0.5);
  TrainState sb{&b, &opt_b, &sched_b};
  TrainProgress q = deserialize_training_state(sb, bytes);
  EXPECT_EQ(q.epoch, 3);
  EXPECT_EQ(q.step, 17);
  EXPECT_EQ(q.samples_seen, 1234);
  EXPECT_TRUE(torch::equal(torch::randn({5}), expected_next));  // RNG restored
  EXPECT_TRUE(torch::equal(a.fc->weight, b.fc->weight));
  EXPECT_DOUBLE_EQ(opt_b.param_groups()[0].options().get_lr(), 0.05);  // decayed LR restored
  // The next step (momentum buffers, scheduler count) evolves identically.
  torch::manual_seed(5);
  TrainOneStep(a, opt_a);
  sched_a.step();
  torch::manual_seed(5);
  TrainOneStep(b, opt_b);
  sched_b.step();
  EXPECT_TRUE(torch::equal(a.fc->weight, b.fc->weight));
  EXPECT_DOUBLE_EQ(opt_a.param_groups()[0].options().get_lr(), opt_b.param_groups()[0].options().get_lr());
}

// The same layer as Net, of another width and dtype.
struct Wide : torch::nn::Module {
  explicit Wide(int64_t out, torch::Dtype dtype = torch::kFloat32) : fc(register_module("fc", torch::nn::Linear(4, out))) {
    to(dtype);
  }
  torch::nn::Linear fc;
};

// A buffer one level down: its name in messages is "body.scale".
struct Inner : torch::nn::Module {
  explicit Inner(int64_t n) { scale = register_buffer("scale", torch::ones({n})); }
  at::Tensor scale;
};
struct Outer : torch::nn::Module {
  explicit Outer(int64_t n) : body(register_module("body", std::make_shared<Inner>(n))) {}
  std::shared_ptr<Inner> body;
};

// What deserialize_training_state throws (and the model must stay as it was), or "" if it loads.
template <typename M>
std::string LoadError(M& model, const std::vector<std::byte>& bytes) {
  std::vector<at::Tensor> before;
  for (const auto& t : model.parameters()) before.push_back(t.clone());
  for (const auto& t : model.buffers()) before.push_back(t.clone());
  try {
    deserialize_training_state(TrainState{&model}, bytes);
  } catch (const SnapshotError& e) {
    std::vector<at::Tensor> after = model.parameters();
    for (const auto& t : model.buffers()) after.push_back(t);
    EXPECT_EQ(after.size(), before.size());
    for (size_t i = 0; i < before.size() && i < after.size(); ++i)
      EXPECT_TRUE(after[i].sizes() == before[i].sizes() && torch::equal(after[i], before[i])) << "tensor " << i << " changed";
    return e.what();
  }
  return "";
}

TEST(TrainingSnapshot, RefusesASnapshotOfAnotherShapeOrDtype) {
  torch::manual_seed(1);
  Net net;
  const std::vector<std::byte> bytes = serialize_training_state(TrainState{&net}, TrainProgress{0, 7, 0});
  Wide wider(5);
  EXPECT_EQ(LoadError(wider, bytes),
            "snapshot does not fit the model: size mismatch for fc.weight: shape [3, 4] in the snapshot, [5, 4] in "
            "the model");
  Wide doubles(3, torch::kFloat64);
  EXPECT_EQ(LoadError(doubles, bytes),
            "snapshot does not fit the model: dtype mismatch for fc.weight: Float in the snapshot, Double in the model");
  Outer outer(3);
  const std::vector<std::byte> outer_bytes = serialize_training_state(TrainState{&outer}, TrainProgress{});
  Outer narrower(2);
  EXPECT_EQ(LoadError(narrower, outer_bytes),
            "snapshot does not fit the model: size mismatch for body.scale: shape [3] in the snapshot, [2] in the model");
  EXPECT_EQ(LoadError(net, outer_bytes), "snapshot does not fit the model: it has no module fc");
  // The same shapes still load.
  Wide same(3);
  EXPECT_EQ(LoadError(same, bytes), "");
  EXPECT_TRUE(torch::equal(same.fc->weight, net.fc->weight));
}

// Net with one more layer, and Inner with one more buffer: what only the snapshot has is refused
// too (Python's strict load_state_dict: "Unexpected key(s)").
struct Deeper : torch::nn::Module {
  Deeper() : fc(register_module("fc", torch::nn::Linear(4, 3))), fc2(register_module("fc2", torch::nn::Linear(3, 2))) {}
  torch::nn::Linear fc;
  torch::nn::Linear fc2;
};
struct InnerPlus : torch::nn::Module {
  explicit InnerPlus(int64_t n) {
    scale = register_buffer("scale", torch::ones({n}));
    shift = register_buffer("shift", torch::zeros({n}));
  }
  at::Tensor scale;
  at::Tensor shift;
};
struct OuterPlus : torch::nn::Module {
  explicit OuterPlus(int64_t n) : body(register_module("body", std::make_shared<InnerPlus>(n))) {}
  std::shared_ptr<InnerPlus> body;
};

TEST(TrainingSnapshot, RefusesASnapshotWithTensorsOrModulesTheModelLacks) {
  torch::manual_seed(2);
  Deeper deeper;
  const std::vector<std::byte> bytes = serialize_training_state(TrainState{&deeper}, TrainProgress{0, 3, 0});
  Net net;
  EXPECT_EQ(LoadError(net, bytes), "snapshot does not fit the model: unexpected module fc2 in the snapshot");
  OuterPlus plus(3);
  const std::vector<std::byte> plus_bytes = serialize_training_state(TrainState{&plus}, TrainProgress{});
  Outer outer(3);
  EXPECT_EQ(LoadError(outer, plus_bytes), "snapshot does not fit the model: unexpected tensor body.shift in the snapshot");
  // The other way round the snapshot lacks them, as before.
  const std::vector<std::byte> net_bytes = serialize_training_state(TrainState{&net}, TrainProgress{});
  EXPECT_EQ(LoadError(deeper, net_bytes), "snapshot does not fit the model: it has no module fc2");
  // A module without state of its own still fits its own snapshot.
  Deeper again;
  EXPECT_EQ(LoadError(again, bytes), "");
  EXPECT_TRUE(torch::equal(again.fc2->weight, deeper.fc2->weight));
}

TEST(TrainingSnapshot, ResumeRefusesASnapshotOfAnotherModelAndKeepsIt) {
  TempDir dir;
  SnapshotOptions o;
  o.dir = dir.path();
  SnapshotStore store(o);
  Net net;
  save_training_snapshot(store, TrainState{&net}, TrainProgress{0, 5, 50}, /*async=*/false);
  Wide wider(5);
  const at::Tensor before = wider.fc->weight.clone();
  try {
    resume_training_snapshot(store, TrainState{&wider}, nullptr);
    ADD_FAILURE() << "a snapshot of a 3-wide layer was resumed into a 5-wide one";
  } catch (const SnapshotError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(store.path_for(5) + ": snapshot does not fit the model: size mismatch for fc.weight", 0), 0u)
        << what;
  }
  EXPECT_TRUE(torch::equal(wider.fc->weight, before));
  EXPECT_EQ(store.list_steps(), std::vector<uint64_t>{5});  // neither loaded nor removed
  Net same;
  auto p = resume_training_snapshot(store, TrainState{&same}, nullptr);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->step, 5);
}

// Two ranks in threads, gloo over a shared HashStore; each has its own snapshot directory.
// `left`, when given, gets each rank's steps on disk after the resume.
std::vector<std::optional<TrainProgress>> ResumeTwoRanks(const std::vector<std::vector<uint64_t>>& steps,
                                                         const std::vector<uint64_t>& corrupt_on_rank1,
                                                         std::vector<std::vector<uint64_t>>* left = nullptr) {
  TempDir dir;
  auto hash = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::optional<TrainProgress>> out(2);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<SnapshotStore>> stores;
  for (int r = 0; r < 2; ++r) {
    SnapshotOptions o;
    o.dir = dir / ("rank" + std::to_string(r));
    o.keep_last = 100;
    stores.push_back(std::make_unique<SnapshotStore>(o));
    torch::manual_seed(r);
    Net net;
    for (uint64_t s : steps[static_cast<size_t>(r)]) {
      TrainProgress p{0, static_cast<int64_t>(s), static_cast<int64_t>(s) * 10};
      save_training_snapshot(*stores.back(), TrainState{&net}, p, /*async=*/false);
    }
  }
  for (uint64_t s : corrupt_on_rank1) std::filesystem::resize_file(stores[1]->path_for(s), 70);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo pg(hash, r, 2, opts);
      Net net;
      out[static_cast<size_t>(r)] = resume_training_snapshot(*stores[static_cast<size_t>(r)], TrainState{&net}, &pg);
    });
  }
  for (auto& t : threads) t.join();
  if (left)
    for (const auto& store : stores) left->push_back(store->list_steps());
  return out;
}

TEST(TrainingSnapshot, RanksAgreeOnTheNewestCommonSnapshot) {
  auto r = ResumeTwoRanks({{10, 20, 30}, {10, 20}}, {});
  ASSERT_TRUE(r[0] && r[1]);
  EXPECT_EQ(r[0]->step, 20);
  EXPECT_EQ(r[1]->step, 20);
  // Rank 1's 20 is torn: both fall back to 10 (rank 0 skips its newer 30 and 20).
  r = ResumeTwoRanks({{10, 20, 30}, {10, 20}}, {20});
  ASSERT_TRUE(r[0] && r[1]);
  EXPECT_EQ(r[0]->step, 10);
  EXPECT_EQ(r[1]->step, 10);
  // No common step (rank 1 kept only 25): both start fresh.
  r = ResumeTwoRanks({{10, 20, 30}, {25}}, {});
  EXPECT_FALSE(r[0]);
  EXPECT_FALSE(r[1]);
  // One rank has nothing: fresh start for both.
  r = ResumeTwoRanks({{10}, {}}, {});
  EXPECT_FALSE(r[0]);
  EXPECT_FALSE(r[1]);
}

// A newer snapshot left on one rank could be agreed on by a later resume, after a save of that
// step which only the other ranks finished: the ranks would resume from two runs. The resume
// removes what lies above the agreed step, and everything on a fresh start.
TEST(TrainingSnapshot, ResumeRemovesTheSnapshotsAboveTheAgreedStep) {
  std::vector<std::vector<uint64_t>> left;
  auto r = ResumeTwoRanks({{10, 20, 30}, {10, 20}}, {}, &left);
  ASSERT_TRUE(r[0] && r[1]);
  EXPECT_EQ(left, (std::vector<std::vector<uint64_t>>{{10, 20}, {10, 20}}));
  left.clear();
  r = ResumeTwoRanks({{10, 20, 30}, {10, 20}}, {20}, &left);  // rank 1's 20 is torn
  ASSERT_TRUE(r[0] && r[1]);
  EXPECT_EQ(left, (std::vector<std::vector<uint64_t>>{{10}, {10}}));
  left.clear();
  r = ResumeTwoRanks({{10, 20, 30}, {25}}, {}, &left);  // nothing in common: fresh start
  EXPECT_FALSE(r[0] || r[1]);
  EXPECT_EQ(left, (std::vector<std::vector<uint64_t>>{{}, {}}));
}

// As under DDP: a frozen parameter is left alone, a gradient undefined on one rank counts as
// zeros there, and one no rank produced stays undefined (weight decay must not move it).
TEST(AllReduceGradients, AveragesUsedGradientsAndLeavesFrozenAndUnusedOnesAlone) {
  struct ThreeLayers : torch::nn::Module {
    ThreeLayers()
        : used(register_module("used", torch::nn::Linear(2, 2))),
          frozen(register_module("frozen", torch::nn::Linear(2, 2))),
          unused(register_module("unused", torch::nn::Linear(2, 2))),
          half(register_module("half", torch::nn::Linear(2, 2))) {}
    torch::nn::Linear used, frozen, unused, half;
  };
  auto hash = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::map<std::string, at::Tensor>> grads(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo pg(hash, r, 2, opts);
      ThreeLayers net;
      for (auto& p : net.frozen->parameters()) p.set_requires_grad(false);
      at::Tensor x = torch::full({1, 2}, static_cast<float>(r + 1));
      at::Tensor loss = net.used->forward(x).sum();
      if (r == 1) loss = loss + net.half->forward(x).sum();  // only rank 1 uses `half`
      loss.backward();
      all_reduce_gradients(net, pg);
      for (const auto& item : net.named_parameters()) {
        const at::Tensor& g = item.value().grad();
        grads[static_cast<size_t>(r)][item.key()] = g.defined() ? g.clone() : at::Tensor();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    auto& g = grads[static_cast<size_t>(r)];
    EXPECT_FALSE(g["frozen.weight"].defined()) << r;
    EXPECT_FALSE(g["unused.weight"].defined()) << r;
    EXPECT_FALSE(g["unused.bias"].defined()) << r;
    ASSERT_TRUE(g["used.weight"].defined() && g["half.weight"].defined()) << r;
    // d(sum(W x + b))/dW = x per row: x is 1 on rank 0 and 2 on rank 1, so the mean is 1.5.
    EXPECT_TRUE(torch::allclose(g["used.weight"], torch::full({2, 2}, 1.5f))) << g["used.weight"];
    EXPECT_TRUE(torch::allclose(g["half.weight"], torch::full({2, 2}, 1.0f))) << g["half.weight"];  // (0 + 2) / 2
  }
  EXPECT_TRUE(torch::equal(grads[0]["used.weight"], grads[1]["used.weight"]));
}

}  // namespace
}  // namespace ctrun::worker
