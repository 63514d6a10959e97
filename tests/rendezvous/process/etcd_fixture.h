// Test helpers for the etcd client and log: a real etcd cluster (1..n members) on free loopback
// ports in a temporary directory, and loop-driving helpers that wait against deadlines.
//
// Lifetime: every member is a child of the test process with PR_SET_PDEATHSIG(SIGKILL) (it dies
// with the test even on a crash) and is SIGKILLed and reaped by ~EtcdCluster. Members run with
// a 50 ms heartbeat and a 500 ms election timeout: fast elections, and 1 s leases are allowed
// (etcd's minimum lease TTL is ceil(1.5 x election timeout)).
#pragma once

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "helpers/free_port.h"
#include "helpers/loop_util.h"
#include "helpers/test_util.h"
#include "rendezvous/curl_loop.h"
#include "sys/event_loop.h"

namespace ctrun::testing {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";
inline constexpr char kEtcdctlBinary[] = "/usr/bin/etcdctl";

inline bool EtcdAvailable() { return access(kEtcdBinary, X_OK) == 0; }

// Starts an asynchronous call and runs the loop until its callback delivered a result.
// start(cb) must pass cb on as the call's callback.
template <typename T>
StatusOr<T> Await(EventLoop& loop, const std::function<void(std::function<void(StatusOr<T>)>)>& start,
                  Duration timeout = Seconds(30)) {
  std::optional<StatusOr<T>> result;
  start([&result](StatusOr<T> r) { result.emplace(std::move(r)); });
  if (!RunUntil(loop, [&] { return result.has_value(); }, timeout))
    return Status::Error("test: no answer within " + std::to_string(ToSeconds(timeout)) + "s");
  return std::move(*result);
}

// A blocking POST for the fixture's own checks (not the code under test). nullopt on transport
// failure; *status gets the HTTP status.
inline std::optional<std::string> BlockingPost(const std::string& url, const std::string& body,
                                               const rdzv::TlsFiles& tls = {}, long* status = nullptr,
                                               const std::string& auth_token = "") {
  std::unique_ptr<CURL, void (*)(CURL*)> easy(curl_easy_init(), curl_easy_cleanup);
  if (!easy) return std::nullopt;
  std::string out;
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!auth_token.empty()) headers = curl_slist_append(headers, ("Authorization: " + auth_token).c_str());
  CURL* e = easy.get();
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_PROXY, "");
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 2000L);
  if (!tls.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, tls.ca_file.c_str());
  if (!tls.cert_file.empty()) curl_easy_setopt(e, CURLOPT_SSLCERT, tls.cert_file.c_str());
  if (!tls.key_file.empty()) curl_easy_setopt(e, CURLOPT_SSLKEY, tls.key_file.c_str());
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &out);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, +[](char* p, size_t s, size_t n, void* u) -> size_t {
    static_cast<std::string*>(u)->append(p, s * n);
    return s * n;
  });
  CURLcode rc = curl_easy_perform(e);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) return std::nullopt;
  if (status) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
  return out;
}


struct EtcdClusterOptions {
  int members = 1;
  std::vector<std::string> extra_flags;  // for every member, e.g. {"--auth-token-ttl", "1"}
  // https:// client URLs with these files (the server's cert and key, and the CA to check
  // clients against: --client-cert-auth).
  bool tls = false;
  std::string server_cert, server_key, ca_file;
  rdzv::TlsFiles client_tls;  // what the fixture's own checks (and etcdctl) present
};

class EtcdCluster {
 public:
  explicit EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)), tls_(options_.client_tls) {
    ::signal(SIGPIPE, SIG_IGN);  // as in the agent: a cut connection is an error, not a death
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) Kill(static_cast<int>(i));
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits (up to `timeout`) until each reports a leader. Retries with
  // new ports when a member dies at start (a port taken meanwhile).
  Status Start(Duration timeout = Seconds(30)) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      for (size_t i = 0; i < members_.size(); ++i) Kill(static_cast<int>(i));
      members_.clear();
      const std::vector<int> ports = FreePorts(2 * options_.members);
      for (int i = 0; i < options_.members; ++i)
        members_.push_back(Member{"m" + std::to_string(i), ports[2 * i], ports[2 * i + 1], -1});
      for (size_t i = 0; i < members_.size(); ++i) Spawn(static_cast<int>(i));
      Status st = WaitReady(timeout);
      if (st.ok() || AllAlive()) return st;
    }
    return Status::Error("etcd members keep dying at start; see " + dir_.path());
  }

  std::string endpoint(int i) const {
    return std::string(options_.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(members_[i].client_port);
  }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(endpoint(static_cast<int>(i)));
    return out;
  }
  std::string endpoints_csv() const {
    std::string out;
    for (const auto& e : endpoints()) out += (out.empty() ? "" : ",") + e;
    return out;
  }
  const rdzv::TlsFiles& client_tls() const { return tls_; }
  const std::string& dir() const { return dir_.path(); }

  void Kill(int i) {
    Member& m = members_[i];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  bool alive(int i) const { return members_[i].pid > 0; }

  // Starts member i again on the same ports and data directory; waits until it serves.
  Status Restart(int i, Duration timeout = Seconds(30)) {
    Kill(i);
    Spawn(i);
    return WaitReady(timeout);
  }

  // The index of the member that is the leader (-1 when no live member knows one).
  int Leader() const {
    for (size_t i = 0; i < members_.size(); ++i) {
      auto st = MemberStatus(static_cast<int>(i));
      if (!st) continue;
      for (size_t j = 0; j < members_.size(); ++j)
        if (members_[j].pid > 0 && MemberId(static_cast<int>(j)) == (*st)["leader"].get<std::string>())
          return static_cast<int>(j);
    }
    return -1;
  }

  // /v3/maintenance/status of member i (no authentication needed), or nullopt.
  std::optional<nlohmann::json> MemberStatus(int i) const {
    if (members_[i].pid <= 0) return std::nullopt;
    auto body = BlockingPost(endpoint(i) + "/v3/maintenance/status", "{}", tls_);
    if (!body) return std::nullopt;
    auto j = nlohmann::json::parse(*body, nullptr, false);
    if (!j.is_object() || !j.contains("leader") || !j.contains("header")) return std::nullopt;
    return j;
  }

  // etcdctl against the whole cluster (for set-up such as users), with extra arguments.
  RunResult Etcdctl(std::vector<std::string> args) const {
    std::vector<std::string> argv = {kEtcdctlBinary, "--endpoints=" + endpoints_csv()};
    if (!tls_.ca_file.empty()) argv.push_back("--cacert=" + tls_.ca_file);
    if (!tls_.cert_file.empty()) argv.push_back("--cert=" + tls_.cert_file);
    if (!tls_.key_file.empty()) argv.push_back("--key=" + tls_.key_file);
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {"ETCDCTL_API=3"}, std::chrono::seconds(20));
  }

 private:
  struct Member {
    std::string name;
    int client_port;
    int peer_port;
    pid_t pid;
  };

  std::string PeerUrl(const Member& m) const { return "http://127.0.0.1:" + std::to_string(m.peer_port); }

  std::string MemberId(int i) const {
    auto st = MemberStatus(i);
    if (!st) return "";
    return (*st)["header"].value("member_id", "");
  }

  bool AllAlive() const {
    for (const Member& m : members_)
      if (m.pid <= 0 || !ProcessAlive(m.pid)) return false;
    return true;
  }

  void Spawn(int i) {
    Member& m = members_[i];
    std::string cluster;
    for (const Member& o : members_) cluster += (cluster.empty() ? "" : ",") + o.name + "=" + PeerUrl(o);
    std::vector<std::string> args = {
        kEtcdBinary,
        "--name=" + m.name,
        "--data-dir=" + dir_.path() + "/" + m.name,
        "--listen-client-urls=" + endpoint(i),
        "--advertise-client-urls=" + endpoint(i),
        "--listen-peer-urls=" + PeerUrl(m),
        "--initial-advertise-peer-urls=" + PeerUrl(m),
        "--initial-cluster=" + cluster,
        "--initial-cluster-token=ctrun-test-" + std::to_string(getpid()) + "-" + std::to_string(members_[0].peer_port),
        "--initial-cluster-state=new",
        "--heartbeat-interval=50",
        "--election-timeout=500",
    };
    if (options_.tls) {
      args.push_back("--cert-file=" + options_.server_cert);
      args.push_back("--key-file=" + options_.server_key);
      args.push_back("--trusted-ca-file=" + options_.ca_file);
      args.push_back("--client-cert-auth");
    }
    args.insert(args.end(), options_.extra_flags.begin(), options_.extra_flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = dir_.path() + "/" + m.name + ".log";
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the test died before prctl
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    m.pid = pid;
  }

  // Every live member answers its status with a leader.
  ctrun::Status WaitReady(Duration timeout) {
    const bool ok = WaitFor(
        [&] {
          for (size_t i = 0; i < members_.size(); ++i) {
            if (members_[i].pid <= 0) continue;
            if (!ProcessAlive(members_[i].pid)) return true;  // died: checked below
            auto st = MemberStatus(static_cast<int>(i));
            if (!st || (*st)["leader"].get<std::string>() == "0") return false;
          }
          return true;
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
    if (ok && AllAliveOrKilled()) return ctrun::Status::Ok();
    return ctrun::Status::Error("etcd did not become ready; logs in " + dir_.path());
  }

  bool AllAliveOrKilled() const {
    for (const Member& m : members_)
      if (m.pid > 0 && !ProcessAlive(m.pid)) return false;
    return true;
  }

  EtcdClusterOptions options_;
  TempDir dir_;
  std::vector<Member> members_;
  rdzv::TlsFiles tls_;
};

}  // namespace ctrun::testing
