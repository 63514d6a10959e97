#include "warm/warm_rules.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

namespace ctrun::warm {
namespace {

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string_view NameOf(std::string_view entry) { return entry.substr(0, entry.find('=')); }

std::map<std::string, std::string> PinnedOf(const std::vector<std::string>& env, bool native) {
  std::map<std::string, std::string> out;
  for (const auto& e : env) {
    std::string_view name = NameOf(e);
    if (!IsPinnedVariable(name, native)) continue;
    // First entry of a name wins, as getenv.
    out.emplace(std::string(name), e.size() > name.size() ? e.substr(name.size() + 1) : "");
  }
  return out;
}

bool HandedOver(const StdioTarget& t) {
  // Listed, not switched on: a kind added later (a terminal, say) starts cold until the warm
  // path learns to hand it over.
  return t.kind == StdioTarget::Kind::kInherit || t.kind == StdioTarget::Kind::kPipe ||
         t.kind == StdioTarget::Kind::kFile || t.kind == StdioTarget::Kind::kDevNull ||
         t.kind == StdioTarget::Kind::kPty;
}

// An interpreter flag the warm path does not parse: one whose value is the next argument (-W,
// -X, a cluster that ends in one: -uW; --check-hash-based-pycs), one that makes stdin the program
// (-, --), or -c or -m in a cluster or glued to their value (-uc, -cCODE). A value glued to -W or
// -X (-Wignore, -Xdev) makes a whole flag, which the server takes as the worker would. Not what
// ctrun builds: such a launch starts cold.
bool TakesValueOrReadsStdin(std::string_view a) {
  if (a == "-" || StartsWith(a, "--")) return true;
  for (size_t i = 1; i < a.size(); ++i) {
    if (a[i] == 'c' || a[i] == 'm') return true;
    if (a[i] == 'W' || a[i] == 'X') return i + 1 == a.size();  // the rest of the argument is the value
  }
  return false;
}

// Where the flags end: at the script, -m or -c.
bool IsFlag(std::string_view a) { return StartsWith(a, "-") && a != "-m" && a != "-c"; }

// A Python interpreter by its file name (python, python3, python3.11, a venv's python): only
// such a program is started as the warm server, which runs `<program> -c <server source>`.
bool IsPython(const std::string& program) {
  const size_t slash = program.rfind('/');
  return StartsWith(std::string_view(program).substr(slash == std::string::npos ? 0 : slash + 1), "python");
}

// The interpreter flag of a Python launch that ParsePythonLaunch refuses, or "".
std::string_view ColdFlag(const std::string& program, const std::vector<std::string>& argv) {
  if (!IsPython(program)) return {};
  for (size_t i = 1; i < argv.size() && IsFlag(argv[i]); ++i) {
    if (TakesValueOrReadsStdin(argv[i])) return argv[i];
  }
  return {};
}

bool IsUtf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace

std::string NotWarmEntrypoint(const SpawnSpec& spec) {
  if (std::string_view flag = ColdFlag(ExecutableOf(spec), spec.argv); !flag.empty())
    return "the interpreter flag " + std::string(flag) + " is given (the warm path takes only flags without a value)";
  return "the entrypoint is not a Python script (.py), module (-m) or code (-c) run by the interpreter, nor a "
         "binary built with CTRUN_MAIN";
}

std::string NotUtf8(const SpawnSpec& spec, const std::string& cwd) {
  const char* kWhy = " is not valid UTF-8 (the warm path hands it over as JSON text)";
  for (const auto& a : spec.argv)
    if (!IsUtf8(a)) return std::string("an argument") + kWhy;
  for (const auto& e : spec.env)
    if (!IsUtf8(e)) {
      const std::string name(NameOf(e));
      return (IsUtf8(name) ? "the environment variable " + name : std::string("an environment variable")) + kWhy;
    }
  if (!IsUtf8(cwd)) return std::string("the working directory's path") + kWhy;
  return "";
}

const std::string& ExecutableOf(const SpawnSpec& spec) {
  static const std::string kNone;
  return !spec.executable.empty() ? spec.executable : spec.argv.empty() ? kNone : spec.argv[0];
}

WarmLaunch NativeLaunch(const SpawnSpec& spec) {
  WarmLaunch n;
  n.program = ExecutableOf(spec);
  n.native = true;
  return n;
}

std::optional<WarmLaunch> ParsePythonLaunch(const SpawnSpec& spec) {
  const auto& a = spec.argv;
  // A wrapper script or a CTRUN_MAIN binary whose arguments look like a Python launch
  // (`./run.sh train.py`, `./train --config cfg.py`) is not an interpreter.
  if (a.size() < 2 || !IsPython(ExecutableOf(spec))) return std::nullopt;
  WarmLaunch p;
  p.program = ExecutableOf(spec);
  size_t i = 1;
  while (i < a.size() && IsFlag(a[i])) {
    if (TakesValueOrReadsStdin(a[i])) return std::nullopt;
    p.flags.push_back(a[i++]);
  }
  if (i >= a.size()) return std::nullopt;
  if (a[i] == "-m" || a[i] == "-c") {
    if (i + 1 >= a.size()) return std::nullopt;
    p.module = a[i] == "-m";
    p.code = a[i] == "-c";
    p.target = p.module ? a[i + 1] : i + 2 < a.size() ? a[i + 2] : "";
    return p;
  }
  const std::string& script = a[i];
  if (script.size() < 4 || script.compare(script.size() - 3, 3, ".py") != 0) return std::nullopt;
  p.target = script;
  return p;
}

bool IsPinnedVariable(std::string_view name, bool native) {
  if (name == "OMP_NUM_THREADS") return native;  // a Python child re-reads it (torch.set_num_threads)
  if (StartsWith(name, "PYTHON")) return !native;
  for (std::string_view prefix : {"LD_", "OMP_", "KMP_", "MKL_", "LC_"})
    if (StartsWith(name, prefix)) return true;
  return name == "LANG" || name == "TORCH_CPP_LOG_LEVEL" || name == "TORCH_SHOW_CPP_STACKTRACES";
}

std::vector<std::string> CommonEnv(const std::vector<SpawnSpec>& specs) {
  if (specs.empty()) return {};
  std::vector<std::set<std::string>> others;
  for (size_t i = 1; i < specs.size(); ++i) others.emplace_back(specs[i].env.begin(), specs[i].env.end());
  std::vector<std::string> out;
  for (const auto& e : specs[0].env)
    if (std::all_of(others.begin(), others.end(), [&](const std::set<std::string>& s) { return s.count(e) > 0; }))
      out.push_back(e);
  return out;
}

ServerIdentity IdentityOf(const WarmLaunch& launch, const std::vector<std::string>& env) {
  return ServerIdentity{launch, PinnedOf(env, launch.native)};
}

std::string WarmMismatch(const ServerIdentity& server, const SpawnSpec& spec) {
  if (server.launch.native) {
    if (ExecutableOf(spec) != server.launch.program)
      return "the executable differs from the warm server's (" + ExecutableOf(spec) + ")";
  } else {
    auto launch = ParsePythonLaunch(spec);
    if (!launch) return NotWarmEntrypoint(spec);
    if (launch->program != server.launch.program)
      return "the interpreter differs from the warm server's (" + launch->program + ")";
    if (launch->flags != server.launch.flags) return "the interpreter flags differ from the warm server's";
  }
  if (!HandedOver(spec.stdin_target) || !HandedOver(spec.stdout_target) || !HandedOver(spec.stderr_target))
    return "the worker's stdio is of a kind the warm path does not hand over";
  // Set before exec in a cold start; a forked child would inherit the server's instead.
  if (!spec.cpu_affinity.empty()) return "per-worker CPU binding is requested (--cpu-binding / --numa-binding)";
  if (spec.stop_before_exec) return "a rank waits for a debugger before exec (--debug-rank)";
  const auto pinned = PinnedOf(spec.env, server.launch.native);
  std::set<std::string> names;
  for (const auto& [k, v] : pinned) names.insert(k);
  for (const auto& [k, v] : server.pinned) names.insert(k);
  for (const auto& name : names) {
    auto a = pinned.find(name), b = server.pinned.find(name);
    const bool same = a != pinned.end() && b != server.pinned.end() ? a->second == b->second
                                                                     : a == pinned.end() && b == server.pinned.end();
    if (!same) return name + " differs from the warm server's (it is read once, at start-up or import)";
  }
  return "";
}

}  // namespace ctrun::warm
