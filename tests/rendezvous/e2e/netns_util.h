// A private network for multi-node tests: one network namespace per node, each with its own
// address, joined by a Linux bridge that lives in a namespace of its own.
//
//   <base>-br   bridge "br0"; port "p<i>" is one end of node i's veth pair
//   <base>-n<i> "eth0" (the pair's other end) with 10.213.<subnet>.<i+1>/24, and "lo" up
//
// The node namespaces have no route out of their /24: a process started in one (Start) reaches
// only the other nodes and its own loopback. Names carry the test process's pid, so runs never
// collide, and namespaces that an earlier, killed run left behind are removed on the way in.
//
// Teardown (destructor): every process the cluster started is SIGKILLed and reaped, then anything
// still living in a node namespace (workers the agents did not stop) is SIGKILLed, and only then are
// the namespaces deleted, which also removes the veth pairs and the bridge.
//
// Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and the `ip` tool: when setup fails, ok() is false and
// error() says which command failed and why, for GTEST_SKIP.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "helpers/test_util.h"

namespace ctrun::testing {

// The `ip` binary (iproute2), or "" when there is none.
inline std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

class NetnsCluster {
 public:
  static constexpr const char* kPrefix = "ctrun-netns-";

  // `subnet`: the third octet of the node addresses (10.213.<subnet>.0/24), one per test.
  NetnsCluster(int subnet, int nodes) : subnet_(subnet), nodes_(nodes) {
    ip_ = IpBinary();
    if (ip_.empty()) {
      error_ = "no `ip` tool (iproute2) found";
      return;
    }
    RemoveStale();
    static int seq = 0;
    base_ = std::string(kPrefix) + std::to_string(::getpid()) + "-" + std::to_string(seq++);
    ok_ = Setup();
  }

  ~NetnsCluster() { Teardown(); }
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  int nodes() const { return nodes_; }
  std::string Bridge() const { return base_ + "-br"; }
  std::string Ns(int node) const { return base_ + "-n" + std::to_string(node); }
  std::string Addr(int node) const { return "10.213." + std::to_string(subnet_) + "." + std::to_string(node + 1); }
  // The namespace whose node holds `addr`, or -1.
  int NodeOf(const std::string& addr) const {
    for (int i = 0; i < nodes_; ++i)
      if (Addr(i) == addr) return i;
    return -1;
  }

  // Starts `argv` inside node `node`'s namespace (`ip netns exec` execs it, so pid() is argv[0]'s
  // process). The cluster owns it: Proc(name) finds it, the destructor kills it.
  BackgroundProcess& Start(const std::string& name, int node, const std::vector<std::string>& argv,
                           const std::vector<std::string>& env, const std::string& out_path,
                           const std::string& err_path) {
    std::vector<std::string> full{ip_, "netns", "exec", Ns(node)};
    full.insert(full.end(), argv.begin(), argv.end());
    auto& slot = procs_[name];
    slot = std::make_unique<BackgroundProcess>(full, env, out_path, err_path);
    return *slot;
  }
  BackgroundProcess& Proc(const std::string& name) { return *procs_.at(name); }

  // Takes node `node`'s link down: at the bridge's end ("the cable is pulled at the switch": the
  // node's own interface stays configured and only loses its carrier) or at the node's own eth0
  // (the node's routes to the others disappear). "" on success, else the error.
  std::string CutLink(int node, bool at_bridge) {
    RunResult r = at_bridge ? Ip({"-n", Bridge(), "link", "set", Port(node), "down"})
                            : Ip({"-n", Ns(node), "link", "set", "eth0", "down"});
    return r.exit_code == 0 ? "" : Describe("link down", r);
  }

  // Undoes CutLink(node, at_bridge) and waits (bounded) until the node's eth0 reports UP again.
  // "" on success, else the error.
  std::string RestoreLink(int node, bool at_bridge) {
    RunResult r = at_bridge ? Ip({"-n", Bridge(), "link", "set", Port(node), "up"})
                            : Ip({"-n", Ns(node), "link", "set", "eth0", "up"});
    if (r.exit_code != 0) return Describe("link up", r);
    if (!WaitFor([&] { return Ip({"-n", Ns(node), "-o", "link", "show", "eth0"}).out.find("state UP") !=
                              std::string::npos; },
                 std::chrono::seconds(10)))
      return "eth0 in " + Ns(node) + " did not come up again";
    return "";
  }

  // Pids of the processes living in node `node`'s namespace (`ip netns pids`).
  std::vector<pid_t> PidsIn(const std::string& ns) {
    std::vector<pid_t> out;
    RunResult r = Ip({"netns", "pids", ns});
    for (const auto& l : SplitLines(r.out))
      if (!l.empty()) out.push_back(static_cast<pid_t>(std::atoi(l.c_str())));
    return out;
  }

 private:
  std::string Port(int node) const { return "p" + std::to_string(node); }

  RunResult Ip(const std::vector<std::string>& args) {
    std::vector<std::string> argv{ip_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {}, std::chrono::seconds(20));
  }

  static std::string Describe(const std::string& what, const RunResult& r) {
    return what + " failed (exit " + std::to_string(r.exit_code) + "): " + r.err + r.out;
  }

  // Runs one setup step; on failure records why and returns false.
  bool Step(const std::vector<std::string>& args) {
    RunResult r = Ip(args);
    if (r.exit_code == 0) return true;
    std::string cmd = "ip";
    for (const auto& a : args) cmd += " " + a;
    error_ = "cannot build the test network: " + Describe("`" + cmd + "`", r);
    return false;
  }

  bool AddNs(const std::string& ns) {
    if (!Step({"netns", "add", ns})) return false;
    created_.push_back(ns);
    return true;
  }

  bool Setup() {
    if (!AddNs(Bridge())) return false;
    if (!Step({"-n", Bridge(), "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"}) ||
        !Step({"-n", Bridge(), "link", "set", "br0", "up"}))
      return false;
    for (int i = 0; i < nodes_; ++i) {
      const std::string ns = Ns(i);
      if (!AddNs(ns)) return false;
      // Created in the bridge's namespace with its peer straight in the node's: no interface
      // ever appears in the namespace the test runs in.
      if (!Step({"-n", Bridge(), "link", "add", Port(i), "type", "veth", "peer", "name", "eth0", "netns", ns}) ||
          !Step({"-n", Bridge(), "link", "set", Port(i), "master", "br0"}) ||
          !Step({"-n", Bridge(), "link", "set", Port(i), "up"}) ||
          !Step({"-n", ns, "addr", "add", Addr(i) + "/24", "dev", "eth0"}) ||
          !Step({"-n", ns, "link", "set", "eth0", "up"}) || !Step({"-n", ns, "link", "set", "lo", "up"}))
        return false;
    }
    // Every node's eth0 reports UP (its bridge port is up too) before the test starts anything.
    for (int i = 0; i < nodes_; ++i) {
      bool up = WaitFor([&] { return Ip({"-n", Ns(i), "-o", "link", "show", "eth0"}).out.find("state UP") !=
                                     std::string::npos; },
                        std::chrono::seconds(10));
      if (!up) {
        error_ = "eth0 in " + Ns(i) + " did not come up: " + Ip({"-n", Ns(i), "-o", "link", "show", "eth0"}).out;
        return false;
      }
    }
    return true;
  }

  void KillEverythingIn(const std::string& ns) {
    for (int round = 0; round < 50; ++round) {
      std::vector<pid_t> pids = PidsIn(ns);
      if (pids.empty()) return;
      for (pid_t p : pids) ::kill(p, SIGKILL);
      WaitFor([&] { for (pid_t p : pids) if (ProcessAlive(p)) return false; return true; },
              std::chrono::seconds(2));
    }
  }

  void DeleteNs(const std::string& ns) {
    KillEverythingIn(ns);
    Ip({"netns", "del", ns});
  }

  void Teardown() {
    for (auto& [name, proc] : procs_) proc->Signal(SIGKILL);
    procs_.clear();  // reaps them
    // Node namespaces first (their veth ends vanish with them), the bridge last.
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) DeleteNs(*it);
    created_.clear();
  }

  // Namespaces of ours whose test process is gone (a run killed before its destructors ran).
  void RemoveStale() {
    RunResult r = Ip({"netns", "list"});
    for (const auto& line : SplitLines(r.out)) {
      const std::string name = line.substr(0, line.find(' '));
      if (name.rfind(kPrefix, 0) != 0) continue;
      const std::string rest = name.substr(std::string(kPrefix).size());
      const pid_t owner = static_cast<pid_t>(std::atoi(rest.c_str()));
      if (owner <= 0 || owner == ::getpid() || ProcessAlive(owner)) continue;
      DeleteNs(name);
    }
  }

  std::string ip_;
  int subnet_ = 0;
  int nodes_ = 0;
  std::string base_;
  bool ok_ = false;
  std::string error_;
  std::vector<std::string> created_;
  std::map<std::string, std::unique_ptr<BackgroundProcess>> procs_;
};

}  // namespace ctrun::testing
