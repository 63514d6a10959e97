// ctrun_store_bench: load generator for any TCPStore server, using ctrun's StoreClient.
//
//   ctrun_store_bench --port P [--host H] [--dialect legacy|modern] [--clients 64]
//                     [--seconds 2] [--barrier 256] [--tag run1]
//
// Prints one "name value" line per measurement:
//   set_ops_s / get_ops_s / add_ops_s   ops per second summed over --clients threads, each with
//                                        its own connection (get = WAIT + GET, as torch clients do)
//   barrier_s                           wall time for --barrier clients to connect, ADD a counter,
//                                        and WAIT for the key the last arriver sets
// The legacy dialect (default) is the one torch 1.13's own server speaks, so the same client can
// measure both servers.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/store_client.h"

namespace {

using Clock = std::chrono::steady_clock;
using ctrun::store::ClientOptions;
using ctrun::store::StoreClient;

struct Args {
  std::string host = "127.0.0.1";
  int port = 0;
  ctrun::store::Dialect dialect = ctrun::store::Dialect::kLegacy;
  int clients = 64;
  double seconds = 2;
  int barrier = 256;
  std::string tag = "run";
};

// Releases every waiting thread at once.
class StartGate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

std::unique_ptr<StoreClient> Connect(const Args& a) {
  ClientOptions o;
  o.host = a.host;
  o.port = a.port;
  o.dialect = a.dialect;
  o.connect_timeout = std::chrono::seconds(60);
  o.timeout = std::chrono::seconds(60);
  auto c = StoreClient::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.message().c_str());
    std::exit(1);
  }
  return std::move(*c);
}

void Die(const ctrun::Status& st) {
  std::fprintf(stderr, "store error: %s\n", st.message().c_str());
  std::exit(1);
}

// Runs op(client, thread_index) in a loop on every client for a.seconds; returns ops/s.
template <typename Op>
double Throughput(const Args& a, std::vector<std::unique_ptr<StoreClient>>& clients, Op op) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> total{0};
  StartGate gate;
  std::vector<std::thread> threads;
  for (int i = 0; i < a.clients; ++i) {
    threads.emplace_back([&, i] {
      gate.Wait();
      int64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        op(*clients[static_cast<size_t>(i)], i);
        ++n;
      }
      // SET has no reply, so a client can run ahead of the server by a socket buffer's worth.
      // A final round trip makes the clock include draining whatever is still queued.
      if (auto k = clients[static_cast<size_t>(i)]->NumKeys(); !k.ok()) Die(k.status());
      total += n;
    });
  }
  auto t0 = Clock::now();
  gate.Open();
  std::this_thread::sleep_for(std::chrono::duration<double>(a.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  return static_cast<double>(total.load()) / dt;
}

double Barrier(const Args& a) {
  StartGate gate;
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<StoreClient>> keep(static_cast<size_t>(a.barrier));
  const std::string counter = "bench/" + a.tag + "/barrier";
  const std::string done = counter + "/done";
  for (int i = 0; i < a.barrier; ++i) {
    threads.emplace_back([&, i] {
      gate.Wait();
      auto c = Connect(a);
      auto n = c->Add(counter, 1);
      if (!n.ok()) Die(n.status());
      if (*n == a.barrier) {
        if (auto st = c->Set(done, "1"); !st.ok()) Die(st);
      }
      if (auto st = c->Wait({done}); !st.ok()) Die(st);
      keep[static_cast<size_t>(i)] = std::move(c);  // close after the clock stops
    });
  }
  auto t0 = Clock::now();
  gate.Open();
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--host") a.host = v;
    else if (k == "--port") a.port = std::atoi(v.c_str());
    else if (k == "--dialect") a.dialect = v == "modern" ? ctrun::store::Dialect::kModern
                                                         : ctrun::store::Dialect::kLegacy;
    else if (k == "--clients") a.clients = std::atoi(v.c_str());
    else if (k == "--seconds") a.seconds = std::atof(v.c_str());
    else if (k == "--barrier") a.barrier = std::atoi(v.c_str());
    else if (k == "--tag") a.tag = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.port <= 0) {
    std::fprintf(stderr, "usage: ctrun_store_bench --port P [options]\n");
    return 2;
  }
  std::vector<std::unique_ptr<StoreClient>> clients;
  for (int i = 0; i < a.clients; ++i) clients.push_back(Connect(a));
  const std::string value(64, 'v');
  const std::string prefix = "bench/" + a.tag + "/";
  for (int i = 0; i < a.clients; ++i) {
    if (auto st = clients[0]->Set(prefix + "get/" + std::to_string(i), value); !st.ok()) Die(st);
  }
  double set = Throughput(a, clients, [&](StoreClient& c, int i) {
    if (auto st = c.Set(prefix + "set/" + std::to_string(i), value); !st.ok()) Die(st);
  });
  double get = Throughput(a, clients, [&](StoreClient& c, int i) {
    if (auto v = c.Get(prefix + "get/" + std::to_string(i)); !v.ok()) Die(v.status());
  });
  double add = Throughput(a, clients, [&](StoreClient& c, int) {
    if (auto n = c.Add(prefix + "add", 1); !n.ok()) Die(n.status());
  });
  clients.clear();
  double barrier = Barrier(a);
  std::printf("set_ops_s %.0f\nget_ops_s %.0f\nadd_ops_s %.0f\nbarrier_s %.4f\n", set, get, add,
              barrier);
  return 0;
}
