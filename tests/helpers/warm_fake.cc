// ctrun_warm_fake: a C++ worker that opts into warm starts (CTRUN_MAIN) for the --warm tests.
// Writes what a process can observe about how it was started to
// DIR/attempt<TORCHELASTIC_RESTART_COUNT>-rank<RANK>.json, then ends as asked.
//
//   ctrun_warm_fake DIR [--barrier N] [--touch-self] [--sleep-ms MS] [--unflushed TEXT]
//                       [--cout TEXT] [--atexit TEXT] [--error MSG | --throw MSG | --exit N]
//                       [--exit-attempt A]
//   --barrier N     after writing, wait (up to 30 s) until N ranks of this attempt wrote theirs
//   --touch-self    in attempt 0, set the binary's mtime to now (a rebuilt binary)
//   --unflushed T   printf T to stdout without a newline or fflush (exit must flush it)
//   --cout T        std::cout << T, unsynchronised with stdio, without a flush (exit must flush it)
//   --atexit T      register an atexit handler that printf's T (no fflush) when the worker exits
//   --error MSG     record MSG in the error file (worker library), exit 1
//   --throw MSG     throw std::runtime_error(MSG) out of main (the terminate handler records it)
//   --exit N        exit code N; with --exit-attempt A only in attempt A (others exit 0)
// Before main (in a static initialiser, so in the warm server), from the environment:
//   WARM_FAKE_STATIC_THREAD=1  start a thread that sleeps (breaks the one-thread rule)
//   WARM_FAKE_STATIC_DLOPEN=P  dlopen P (a stand-in libcuda.so.1: the CUDA rule)
//   WARM_FAKE_STATIC_CUINIT=1  and call its cuInit(0): the driver initialised
//   WARM_FAKE_STATIC_EXIT=N    _exit(N) when started as the server (one that dies before it is ready)
//   WARM_FAKE_STATIC_BEAT=1    ask heartbeat_enabled() (the server reads its variables: none)
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ctrun/error_file.h"
#include "ctrun/heartbeat.h"
#include "ctrun/warm_main.h"

extern char** environ;

namespace {

using nlohmann::json;

const bool kStaticInit = [] {
  const char* exit_code = std::getenv("WARM_FAKE_STATIC_EXIT");
  if (exit_code && std::getenv("CTRUN_WARM_SERVER")) ::_exit(std::atoi(exit_code));
  if (const char* v = std::getenv("WARM_FAKE_STATIC_THREAD"); v && *v == '1')
    std::thread([] { std::this_thread::sleep_for(std::chrono::seconds(60)); }).detach();
  if (const char* v = std::getenv("WARM_FAKE_STATIC_DLOPEN")) {
    void* lib = ::dlopen(v, RTLD_NOW);
    const char* init = std::getenv("WARM_FAKE_STATIC_CUINIT");
    if (lib && init && *init == '1')
      if (auto cu_init = reinterpret_cast<int (*)(unsigned)>(::dlsym(lib, "cuInit"))) cu_init(0);
  }
  if (const char* v = std::getenv("WARM_FAKE_STATIC_BEAT"); v && *v == '1') (void)ctrun::worker::heartbeat_enabled();
  return true;
}();

std::string Env(const char* k, const char* dflt = "") {
  const char* v = std::getenv(k);
  return v ? v : dflt;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string Link(const std::string& path) {
  char buf[512];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
}

json Fds() {
  std::vector<int> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int self = ::dirfd(d);
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.' && std::atoi(e->d_name) != self) fds.push_back(std::atoi(e->d_name));
    ::closedir(d);
  }
  json out = json::object();
  for (int fd : fds) {
    std::string target = Link("/proc/self/fd/" + std::to_string(fd));
    // Pipe and socket inode numbers differ between any two runs: their kind is what counts.
    if (target.starts_with("pipe:")) target = "pipe";
    if (target.starts_with("socket:")) target = "socket";
    out[std::to_string(fd)] = {{"target", target}, {"cloexec", (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0}};
  }
  return out;
}

json Status() {
  json out;
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    const std::string k = line.substr(0, line.find(':'));
    if (k == "SigBlk" || k == "SigIgn" || k == "SigCgt" || k == "Threads" || k == "NoNewPrivs")
      out[k] = line.substr(line.find_first_not_of(" \t", k.size() + 1));
  }
  return out;
}

json Cmdline() {
  const std::string raw = ReadFile("/proc/self/cmdline");
  json out = json::array();
  for (size_t at = 0; at < raw.size();) {
    const size_t end = raw.find('\0', at);
    out.push_back(raw.substr(at, end - at));
    at = end == std::string::npos ? raw.size() : end + 1;
  }
  return out;
}

void Observe(const std::string& path, int argc, char** argv) {
  json j;
  j["env"] = json::object();
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    j["env"][kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  j["argv"] = std::vector<std::string>(argv, argv + argc);
  j["cmdline"] = Cmdline();
  j["program_invocation_name"] = program_invocation_name;
  char cwd[4096];
  j["cwd"] = ::getcwd(cwd, sizeof cwd) ? cwd : "?";
  j["exe"] = Link("/proc/self/exe");
  j["comm"] = ReadFile("/proc/self/comm");
  j["parent_comm"] = ReadFile("/proc/" + std::to_string(::getppid()) + "/comm");
  j["fds"] = Fds();
  j["status"] = Status();
  j["pgid_is_pid"] = ::getpgid(0) == ::getpid();
  int pdeathsig = 0;
  ::prctl(PR_GET_PDEATHSIG, &pdeathsig);
  j["pdeathsig"] = pdeathsig;
  const mode_t mask = ::umask(0);
  ::umask(mask);
  j["umask"] = mask;
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  j["nofile"] = {nofile.rlim_cur, nofile.rlim_max};
  j["heartbeat"] = ctrun::worker::heartbeat_enabled() && ctrun::heartbeat() > 0;
  j["static_init_ran"] = kStaticInit;
  std::ofstream(path + ".tmp") << j.dump(1);
  std::rename((path + ".tmp").c_str(), path.c_str());
}

int FakeMain(int argc, char** argv) {
  ctrun::worker::install_terminate_handler();
  if (argc < 2) return 64;
  const std::string dir = argv[1], attempt = Env("TORCHELASTIC_RESTART_COUNT", "0");
  std::vector<std::string> a(argv + 2, argv + argc);
  auto opt = [&](const char* name, const char* dflt = "") -> std::string {
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == name) return a[i + 1];
    return dflt;
  };
  auto has = [&](const char* name) { return std::find(a.begin(), a.end(), name) != a.end(); };
  Observe(dir + "/attempt" + attempt + "-rank" + Env("RANK", "0") + ".json", argc, argv);
  if (const int n = std::atoi(opt("--barrier", "0").c_str()); n > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto all = [&] {
      for (int r = 0; r < n; ++r)
        if (::access((dir + "/attempt" + attempt + "-rank" + std::to_string(r) + ".json").c_str(), F_OK) != 0)
          return false;
      return true;
    };
    while (!all() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (has("--touch-self") && attempt == "0") ::utimensat(AT_FDCWD, "/proc/self/exe", nullptr, 0);
  if (const long ms = std::atol(opt("--sleep-ms", "0").c_str()); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  if (has("--unflushed")) std::printf("%s", opt("--unflushed").c_str());
  if (has("--cout")) {
    std::ios::sync_with_stdio(false);
    std::cout << opt("--cout");
  }
  static std::string at_exit_text;
  if (has("--atexit")) {
    at_exit_text = opt("--atexit");
    std::atexit([] { std::printf("%s", at_exit_text.c_str()); });
  }
  const std::string only = opt("--exit-attempt", "");
  if (!only.empty() && only != attempt) return 0;
  if (has("--error")) {
    ctrun::worker::record_error("RuntimeError: " + opt("--error"));
    return 1;
  }
  if (has("--throw")) throw std::runtime_error(opt("--throw"));
  return std::atoi(opt("--exit", "0").c_str());
}

}  // namespace

CTRUN_MAIN(FakeMain)
