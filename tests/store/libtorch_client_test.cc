// LibTorch 1.13 c10d::TCPStore (C++) as a client of ctrun's StoreServer, in one process: the
// server's EventLoop runs on a background thread. Exit code 0 when every check passed.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "store/store_client.h"
#include "store/store_server.h"
#include "sys/event_loop.h"

namespace {

int failures = 0;

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

std::vector<uint8_t> B(const std::string& s) { return {s.begin(), s.end()}; }
std::string S(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

int main() {
  using namespace std::chrono_literals;
  ctrun::EventLoop loop;
  auto server = ctrun::store::StoreServer::Start(loop, {});
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.message().c_str());
    return 1;
  }
  const int port = (*server)->port();
  std::atomic<bool> stop{false};
  std::thread loop_thread([&] {
    while (!stop.load()) loop.RunOnce(std::chrono::milliseconds(100));
  });

  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = false;
    o.numWorkers = 2;  // the client then ADDs "init/" once, as env:// workers do
    o.waitWorkers = true;
    o.timeout = std::chrono::milliseconds(10000);
    c10d::TCPStore a("127.0.0.1", o);
    c10d::TCPStore b("127.0.0.1", o);

    a.set("key", B("value"));
    EXPECT(S(b.get("key")) == "value");
    EXPECT(a.add("counter", 3) == 3);
    EXPECT(b.add("counter", 4) == 7);
    EXPECT(S(a.get("counter")) == "7");
    EXPECT(S(a.compareSet("key", B("value"), B("new"))) == "new");
    EXPECT(S(a.compareSet("key", B("value"), B("other"))) == "new");
    EXPECT(S(a.compareSet("fresh", B(""), B("x"))) == "x");
    EXPECT(b.check({"key", "fresh"}));
    EXPECT(!b.check({"missing"}));
    // "init/" (from both clients' ADD), "/key", "/counter", "/fresh": torch's server counts all.
    EXPECT(a.getNumKeys() == 4);
    EXPECT(a.deleteKey("fresh"));
    EXPECT(!a.deleteKey("fresh"));
    EXPECT(a.getNumKeys() == 3);

    // A wait woken by another client.
    std::thread waiter([&] { b.wait({"late"}, std::chrono::milliseconds(10000)); });
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while ((*server)->num_waiting() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT((*server)->num_waiting() == 1);
    a.set("late", B("1"));
    waiter.join();

    // A wait that times out throws, and the server drops the parked state with the connection.
    bool threw = false;
    {
      c10d::TCPStore c("127.0.0.1", o);
      try {
        c.wait({"never"}, std::chrono::milliseconds(200));
      } catch (const std::exception&) {
        threw = true;
      }
    }
    EXPECT(threw);

    // torch 1.13 prefixes every key with "/": ctrun's own client sees the raw names.
    ctrun::store::ClientOptions co;
    co.port = port;
    co.dialect = ctrun::store::Dialect::kLegacy;
    auto raw = ctrun::store::StoreClient::Connect(co);
    EXPECT(raw.ok());
    if (raw.ok()) {
      auto v = (*raw)->Get("/key");
      EXPECT(v.ok() && *v == "new");
      auto init = (*raw)->Get("init/");
      EXPECT(init.ok() && *init == "3");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    ++failures;
  }

  stop = true;
  loop.Wake();
  loop_thread.join();
  server->reset();
  std::printf("%s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
