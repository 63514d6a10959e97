#include "helpers/test_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/stack_text.h"
#include "helpers/free_port.h"

extern char** environ;

namespace ctrun::testing {

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ctrun_test_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

std::vector<char*> MakeEnv(const std::vector<std::string>& extra, std::vector<std::string>* storage) {
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    bool overridden = false;
    for (const auto& x : extra) overridden |= x.substr(0, x.find('=')) == key;
    if (!overridden) storage->push_back(kv);
  }
  for (const auto& x : extra) storage->push_back(x);
  std::vector<char*> out;
  for (auto& s : *storage) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

pid_t ForkExec(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env, int out_fd,
               int err_fd) {
  std::vector<std::string> env_storage;
  std::vector<char*> envp = MakeEnv(extra_env, &env_storage);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& s : args) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int nul = open("/dev/null", O_RDONLY);
    dup2(nul, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execve(cargv[0], cargv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

int ShellCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// Field 3 of /proc/<pid>/stat (R, S, D, Z, ...), read after the last ')': the command may hold
// any byte. '\0' when the process is gone.
char ProcState(pid_t pid) {
  const std::string stat = ReadFileOr("/proc/" + std::to_string(pid) + "/stat");
  const size_t rp = stat.rfind(')');
  return rp == std::string::npos || rp + 2 >= stat.size() ? '\0' : stat[rp + 2];
}

// "LWP 20917 \"ctrun\"" from gdb's `Thread 3 (Thread 0x7f.. (LWP 20917) "ctrun"):` (or its
// `(process N)` form), "LWP 20917" from eu-stack's `TID 20917:`.
std::string ThreadLabel(const StackThread& t) {
  if (t.header.empty()) return "the only thread";
  if (t.tid == 0) return std::string(t.header);
  return "LWP " + std::to_string(t.tid) + (t.name.empty() ? "" : " \"" + std::string(t.name) + "\"");
}

}  // namespace

std::string CompactStacks(const std::string& backtraces) {
  struct Thread {
    std::string label;
    std::vector<std::pair<std::string, int>> frames;  // function, times in a row
  };
  std::vector<Thread> threads;
  for (const StackThread& t : ReadStackThreads(backtraces)) {
    Thread& thread = threads.emplace_back(Thread{ThreadLabel(t), {}});
    for (std::string_view line : t.frames) {
      std::string f = FrameFunction(line);
      if (!thread.frames.empty() && thread.frames.back().first == f) ++thread.frames.back().second;
      else thread.frames.emplace_back(std::move(f), 1);
    }
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> stacks;  // stack, its threads
  for (const Thread& t : threads) {
    std::string stack;
    for (const auto& [f, n] : t.frames)
      stack += (stack.empty() ? "" : " < ") + f + (n > 1 ? " x" + std::to_string(n) : "");
    auto same = std::find_if(stacks.begin(), stacks.end(), [&](const auto& s) { return s.first == stack; });
    if (same == stacks.end()) stacks.push_back({stack, {t.label}});
    else same->second.push_back(t.label);
  }
  std::string out;
  for (const auto& [stack, labels] : stacks) {
    std::string who = labels.size() == 1 ? labels[0] : std::to_string(labels.size()) + " threads";
    if (labels.size() > 1)
      for (size_t i = 0; i < labels.size(); ++i) who += (i ? ", " : " (") + labels[i];
    out += "  " + who + (labels.size() > 1 ? ")" : "") + ": " + stack + "\n";
  }
  return out;
}

namespace {

// What a command that ran past its timeout was doing: every process below it (pid, state, kernel
// wait channel, command line) and every thread's stack through eu-stack, else gdb (bounded),
// folded by CompactStacks and appended to its stderr so that a rare hang in a test run explains
// itself within the part of a long failure that a CI log keeps.
std::string DescribeHungTree(pid_t root) {
  std::vector<pid_t> pids = LiveDescendants(root);
  pids.insert(pids.begin(), root);
  std::string out = "\n--- timed out; the processes below pid " + std::to_string(root) + ":\n";
  std::string stacks;  // the command, less the pid
  if (access("/usr/bin/eu-stack", X_OK) == 0) stacks = "timeout 10 /usr/bin/eu-stack -p ";
  else if (access("/usr/bin/gdb", X_OK) == 0)
    stacks = "timeout 20 /usr/bin/gdb -batch -nx -ex 'thread apply all bt 40' -p ";
  for (pid_t p : pids) {
    const std::string proc = "/proc/" + std::to_string(p);
    std::string cmd = ReadFileOr(proc + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const char state = ProcState(p);
    out += "pid " + std::to_string(p) + " state " + (state ? std::string(1, state) : "?") + " wchan " + ReadFileOr(proc + "/wchan") + ": " + cmd + "\n";
    if (stacks.empty()) continue;
    const std::string c = stacks + std::to_string(p) + " 2>&1";
    std::string trace;
    if (FILE* f = popen(c.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof buf, f)) > 0 && trace.size() < (1u << 20)) trace.append(buf, n);
      pclose(f);
    }
    out += CompactStacks(trace);
  }
  return out;
}

}  // namespace

RunResult RunCommand(const std::vector<std::string>& argv, const std::vector<std::string>& given_env,
              std::chrono::milliseconds timeout) {
  std::vector<std::string> extra_env = given_env;
  if (std::none_of(extra_env.begin(), extra_env.end(),
                   [](const std::string& e) { return e.rfind("PET_MASTER_PORT=", 0) == 0; }))
    extra_env.push_back("PET_MASTER_PORT=" + std::to_string(FreePort()));
  TempDir dir;
  std::string out_path = dir / "out", err_path = dir / "err";
  int out_fd = open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = ForkExec(argv, extra_env, out_fd, err_fd);
  close(out_fd);
  close(err_fd);
  RunResult r;
  int status = 0;
  bool done = WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout);
  std::string hung;
  if (!done) {
    hung = DescribeHungTree(pid);
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    r.exit_code = -1;
  } else {
    r.exit_code = ShellCode(status);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.out = ReadFileOr(out_path);
  r.err = ReadFileOr(err_path) + hung;
  return r;
}

bool PythonCanImport(const std::string& module) {
  static std::map<std::string, bool> known;
  auto it = known.find(module);
  if (it == known.end())
    it = known.emplace(module, RunCommand({"/usr/bin/python3", "-c", "import " + module}, {}, std::chrono::seconds(60))
                                       .exit_code == 0).first;
  return it->second;
}

BackgroundProcess::BackgroundProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                                     const std::string& out_path, const std::string& err_path) {
  int out_fd = open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  pid_ = ForkExec(argv, extra_env, out_fd, err_fd);
  close(out_fd);
  close(err_fd);
}

BackgroundProcess::~BackgroundProcess() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
}

void BackgroundProcess::Signal(int sig) { kill(pid_, sig); }

int BackgroundProcess::Wait(std::chrono::milliseconds timeout) {
  if (!reaped_) {
    reaped_ = WaitFor([&] { return waitpid(pid_, &status_, WNOHANG) == pid_; }, timeout);
    if (!reaped_) return -1;
  }
  return ShellCode(status_);
}

bool ProcessAlive(pid_t pid) {
  const char state = ProcState(pid);
  return state != '\0' && state != 'Z' && state != 'X';
}

std::string WorkersCgroupFromLog(const std::string& log) {
  const std::string tag = "workers run in cgroup ";
  for (const auto& l : SplitLines(log)) {
    const size_t at = l.find(tag);
    if (at == std::string::npos) continue;
    const size_t from = at + tag.size();
    return l.substr(from, l.find(' ', from) - from);
  }
  return "";
}

int CountOf(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

pid_t ParentOf(pid_t pid) {
  const std::string stat = ReadFileOr("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  int ppid = 0;
  char state = 0;
  if (close == std::string::npos || std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2 ||
      state == 'Z') {
    return 0;
  }
  return ppid;
}

std::vector<pid_t> LiveDescendants(pid_t ancestor) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string base = e.path().filename().string();
    if (base.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(base));
    for (pid_t p = ParentOf(pid); p > 1; p = ParentOf(p))
      if (p == ancestor) {
        if (ProcessAlive(pid)) out.push_back(pid);
        break;
      }
  }
  return out;
}

pid_t WatchdogBelow(pid_t ctrun) {
  for (pid_t p : LiveDescendants(ctrun))
    if (ReadFileOr("/proc/" + std::to_string(p) + "/comm") == "ct-watchdog\n") return p;
  return 0;
}

std::string ReadFileOr(const std::string& path, const std::string& fallback) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fallback;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

std::vector<pid_t> ReadPids(const std::string& path) {
  std::vector<pid_t> out;
  for (const auto& l : SplitLines(ReadFileOr(path)))
    if (!l.empty()) out.push_back(static_cast<pid_t>(std::atoi(l.c_str())));
  return out;
}

std::map<std::string, std::string> ReadEnvFile(const std::string& path) {
  std::map<std::string, std::string> env;
  for (const auto& line : SplitLines(ReadFileOr(path))) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

}  // namespace ctrun::testing
