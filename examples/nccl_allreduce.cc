// nccl_allreduce — bootstrap NCCL from the launcher environment and measure an all-reduce.
//
// Rank 0 creates the ncclUniqueId and publishes it through the c10d store that the environment
// describes: the agent's store (TORCHELASTIC_USE_AGENT_STORE=True; keys under the torch 1.13
// per-attempt prefix "/worker/attempt_<n>/") or a store that rank 0 hosts itself on MASTER_PORT.
// Each rank binds GPU LOCAL_RANK, joins the communicator, all-reduces a float buffer of ones,
// checks every element equals WORLD_SIZE, and rank 0 prints algorithm and bus bandwidth
// (busbw = algbw * 2(n-1)/n, as nccl-tests report it). Host code only: cudaMemcpy + ncclAllReduce.
// Exit 0 on success, 1 on any failure (also recorded in TORCHELASTIC_ERROR_FILE).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ctrun/worker.h"
#include "store/store_client.h"
#include "store/store_server.h"
#include "sys/event_loop.h"

namespace {

namespace cw = ctrun::worker;

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void CheckNccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}
template <typename T>
T Must(ctrun::StatusOr<T> v, const char* what) {
  if (!v.ok()) throw std::runtime_error(std::string(what) + ": " + v.message());
  return std::move(v).value();
}
void Must(const ctrun::Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.message());
}

// Worker-hosted mode: a ctrun StoreServer on its own event-loop thread, for rank 0's lifetime.
class HostedStore {
 public:
  explicit HostedStore(int port) {
    std::promise<std::string> started;
    auto result = started.get_future();
    thread_ = std::thread([this, port, &started] {
      ctrun::EventLoop loop;
      ctrun::store::ServerOptions opts;
      opts.bind_host = "";  // every IPv4 address, like torch's TCPStore server
      opts.port = port;
      auto server = ctrun::store::StoreServer::Start(loop, opts);
      started.set_value(server.ok() ? std::string() : server.message());
      if (!server.ok()) return;
      while (!stop_.load()) loop.RunOnce(ctrun::Seconds(0.05));
    });
    if (std::string err = result.get(); !err.empty()) {
      thread_.join();
      throw std::runtime_error("hosting the store on port " + std::to_string(port) + ": " + err);
    }
  }
  ~HostedStore() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int Run(int argc, char** argv) {
  size_t bytes = 64u << 20;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--bytes=", 8) == 0) bytes = std::strtoull(argv[i] + 8, nullptr, 10);
    if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
  }
  const cw::LaunchEnv env = cw::LaunchEnv::from_env();
  std::unique_ptr<HostedStore> hosted;
  if (env.hosts_store()) hosted = std::make_unique<HostedStore>(env.master_port);
  ctrun::store::ClientOptions copts;
  copts.host = env.master_addr;
  copts.port = env.master_port;
  copts.dialect = ctrun::store::Dialect::kLegacy;  // understood by torch 1.13 and ctrun servers
  auto store = Must(ctrun::store::StoreClient::Connect(copts), "store connect");
  const std::string prefix = (env.use_agent_store ? env.attempt_prefix() : std::string()) + "/nccl_allreduce/";

  ncclUniqueId id;
  if (env.rank == 0) {
    CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    Must(store->Set(prefix + "unique_id", std::string_view(id.internal, sizeof id.internal)), "store set");
  } else {
    std::string v = Must(store->Get(prefix + "unique_id"), "store get unique_id");
    if (v.size() != sizeof id.internal) throw std::runtime_error("bad ncclUniqueId size in store");
    std::memcpy(id.internal, v.data(), v.size());
  }

  int ngpus = 0;
  CheckCuda(cudaGetDeviceCount(&ngpus), "cudaGetDeviceCount");
  if (env.local_rank >= ngpus) {
    throw std::runtime_error("LOCAL_RANK " + std::to_string(env.local_rank) + " but only " +
                             std::to_string(ngpus) + " visible GPU(s)");
  }
  CheckCuda(cudaSetDevice(env.local_rank), "cudaSetDevice");
  ncclComm_t comm;
  CheckNccl(ncclCommInitRank(&comm, env.world_size, id, env.rank), "ncclCommInitRank");
  cudaStream_t stream;
  CheckCuda(cudaStreamCreate(&stream), "cudaStreamCreate");

  const size_t count = bytes / sizeof(float);
  float* buf = nullptr;
  CheckCuda(cudaMalloc(&buf, count * sizeof(float)), "cudaMalloc");
  std::vector<float> host(count, 1.0f);
  auto reset = [&] { CheckCuda(cudaMemcpy(buf, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy"); };

  // Correctness: one all-reduce of ones.
  reset();
  CheckNccl(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, stream), "ncclAllReduce");
  CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<float> back(count);
  CheckCuda(cudaMemcpy(back.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy back");
  size_t bad = 0;
  for (float v : back) bad += v != static_cast<float>(env.world_size);

  // Bandwidth: warm up, then time `iters` back-to-back all-reduces.
  for (int i = 0; i < 3; ++i) CheckNccl(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, stream), "warmup");
  CheckCuda(cudaStreamSynchronize(stream), "sync");
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) CheckNccl(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, stream), "timed");
  CheckCuda(cudaStreamSynchronize(stream), "sync");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  const double algbw = static_cast<double>(count * sizeof(float)) / secs / 1e9;
  const double busbw = algbw * 2.0 * (env.world_size - 1) / env.world_size;
  std::printf("nccl_allreduce rank %d/%d gpu %d: %s; %zu bytes, %.3f ms, algbw %.2f GB/s, busbw %.2f GB/s\n",
              env.rank, env.world_size, env.local_rank, bad == 0 ? "result OK" : "RESULT WRONG", bytes,
              secs * 1e3, algbw, busbw);
  std::fflush(stdout);

  ncclCommDestroy(comm);
  cudaFree(buf);
  cudaStreamDestroy(stream);
  // Leave together: rank 0 may be hosting the store the others still use.
  if (Must(store->Add(prefix + "done", 1), "store add") == env.world_size) Must(store->Set(prefix + "all_done", "1"), "set");
  Must(store->Wait({prefix + "all_done"}), "store wait");
  // Thrown after the leaving barrier, so the others are not left waiting; run_recorded writes
  // the error file and exits 1.
  if (bad > 0)
    throw std::runtime_error("all-reduce result wrong: " + std::to_string(bad) + " of " + std::to_string(back.size()) +
                             " elements differ from WORLD_SIZE " + std::to_string(env.world_size));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cw::install_terminate_handler();
  return cw::run_recorded([&] { return Run(argc, argv); });
}
