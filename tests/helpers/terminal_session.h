// TerminalSession: runs a command as the session leader of a fresh pseudo-terminal, the way a
// shell in a terminal emulator would (setsid + TIOCSCTTY in the child, stdin/stdout/stderr on the
// slave). The test holds the master: it types keys (Ctrl-C is "\x03", Ctrl-Z "\x1a"), reads the
// "screen" (every byte the terminal received, unrendered), resizes the window (the kernel sends
// SIGWINCH to the foreground group) and plays the shell's part in job control (Continue = `fg`).
// Every wait polls the master against a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace ctrun::testing {

class TerminalSession {
 public:
  TerminalSession(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                  unsigned short rows = 24, unsigned short cols = 80) {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master_ < 0 || ::grantpt(master_) != 0 || ::unlockpt(master_) != 0) return;
    const char* slave_name = ::ptsname(master_);
    if (slave_name == nullptr) return;
    const std::string slave_path = slave_name;
    Resize(rows, cols);
    std::vector<std::string> env_storage;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e, key = kv.substr(0, kv.find('='));
      bool overridden = false;
      for (const auto& x : extra_env) overridden |= x.substr(0, x.find('=')) == key;
      if (!overridden) env_storage.push_back(kv);
    }
    for (const auto& x : extra_env) env_storage.push_back(x);
    std::vector<char*> envp, args;
    for (auto& s : env_storage) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      int slave = ::open(slave_path.c_str(), O_RDWR);  // the first tty a session leader opens...
      if (slave < 0) ::_exit(121);
      ::ioctl(slave, TIOCSCTTY, 0);  // ...becomes its controlling terminal (explicitly, too)
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(slave, 0);
      ::dup2(slave, 1);
      ::dup2(slave, 2);
      if (slave > 2) ::close(slave);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::fcntl(master_, F_SETFL, ::fcntl(master_, F_GETFL) | O_NONBLOCK);
  }

  ~TerminalSession() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);  // the session leader's group: ctrun (workers die by PDEATHSIG)
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    if (master_ >= 0) ::close(master_);
  }
  TerminalSession(const TerminalSession&) = delete;
  TerminalSession& operator=(const TerminalSession&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  const std::string& screen() const { return screen_; }

  void Type(const std::string& keys) { (void)!::write(master_, keys.data(), keys.size()); }
  void Resize(unsigned short rows, unsigned short cols) {
    winsize ws{};
    ws.ws_row = rows;
    ws.ws_col = cols;
    ::ioctl(master_, TIOCSWINSZ, &ws);
  }

  // Reads what the terminal received, waiting at most `ms` for the first byte.
  void Pump(int ms) {
    pollfd p{master_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(master_, buf, sizeof buf);
      if (n <= 0) return;  // EAGAIN, or EIO once every slave fd is closed
      screen_.append(buf, static_cast<size_t>(n));
    }
  }

  // Until the screen contains `text` (after `from`), or the timeout.
  bool WaitForText(const std::string& text, std::chrono::milliseconds timeout, size_t from = 0) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (screen_.find(text, from) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      Pump(10);
    }
    return true;
  }

  // Waits for the command to exit (reading the screen meanwhile); its shell code, or -1.
  int Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        Pump(0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      Pump(10);
    }
  }

  // `fg`: the shell continues the job.
  void Continue() { ::kill(pid_, SIGCONT); }

 private:
  int master_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string screen_;
};

// The state letter of /proc/<pid>/stat ('R', 'S', 'T' stopped, 'Z', ...); '?' when gone.
inline char ProcState(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return '?';
  char buf[512] = {0};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  size_t close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() ? s[close + 2] : '?';
}

}  // namespace ctrun::testing
