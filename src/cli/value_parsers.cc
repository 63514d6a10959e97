#include "cli/value_parsers.h"

#include <algorithm>
#include <csignal>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

#include "process/exit_status.h"

namespace ctrun {
namespace {

std::string_view Trim(std::string_view s) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

StatusOr<int> ParseInt(std::string_view text) {
  std::string_view s = Trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return Status::Error("not an integer");
  long long v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) return Status::Error("integer out of range");
  if (ec != std::errc() || ptr != s.data() + s.size()) return Status::Error("not an integer");
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    return Status::Error("integer out of range");
  return static_cast<int>(v);
}

StatusOr<double> ParseNumber(std::string_view text) {
  std::string_view s = Trim(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return Status::Error("not a number");
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) return Status::Error("number out of range");
  if (ec != std::errc() || ptr != s.data() + s.size()) return Status::Error("not a number");
  if (!std::isfinite(v)) return Status::Error("not a finite number");
  return v;
}

StatusOr<double> ParseSeconds(std::string_view text, bool zero_ok) {
  auto v = ParseNumber(text);
  if (!v) return v.status();
  if (zero_ok ? *v < 0 : *v <= 0) return Status::Error(zero_ok ? "must be >= 0 seconds" : "must be > 0 seconds");
  if (*v > kMaxSeconds) return Status::Error("must be at most 1e9 seconds (about 31 years)");
  return *v;
}

StatusOr<NodeRange> ParseNnodes(std::string_view text) {
  std::vector<std::string_view> parts = Split(text, ':');
  if (parts.size() > 2) return Status::Error("expected N or MIN:MAX (more than two ':'-separated parts)");
  auto min = ParseInt(parts[0]);
  if (!min) return Status::Error("expected N or MIN:MAX where N, MIN and MAX are integers");
  NodeRange r{*min, *min};
  if (parts.size() == 2) {
    auto max = ParseInt(parts[1]);
    if (!max) return Status::Error("expected N or MIN:MAX where N, MIN and MAX are integers");
    r.max_nodes = *max;
  }
  if (r.min_nodes <= 0) return Status::Error("the number of nodes must be >= 1");
  if (r.min_nodes > r.max_nodes)
    return Status::Error("MIN (" + std::to_string(r.min_nodes) + ") must not exceed MAX (" +
                         std::to_string(r.max_nodes) + ")");
  return r;
}

std::string FormatNnodes(int min_nodes, int max_nodes) {
  return min_nodes == max_nodes ? std::to_string(max_nodes) : std::to_string(min_nodes) + ":" + std::to_string(max_nodes);
}

StatusOr<NprocSpec> ParseNprocPerNode(std::string_view text) {
  std::string s = Lower(Trim(text));
  NprocSpec spec;
  if (s == "cpu") {
    spec.kind = NprocSpec::Kind::kCpu;
    return spec;
  }
  if (s == "gpu") {
    spec.kind = NprocSpec::Kind::kGpu;
    return spec;
  }
  if (s == "auto") {
    spec.kind = NprocSpec::Kind::kAuto;
    return spec;
  }
  if (s == "xpu" || s == "npu" || s == "mps" || s == "hpu")
    return Status::Error("'" + s + "' devices are not supported by ctrun (supported: an integer >= 1, cpu, gpu, auto)");
  auto n = ParseInt(s);
  if (!n) return Status::Error("expected an integer >= 1, cpu, gpu or auto");
  if (*n < 1) return Status::Error("the number of workers per node must be >= 1");
  spec.kind = NprocSpec::Kind::kCount;
  spec.count = *n;
  return spec;
}

StatusOr<std::map<std::string, std::string>> ParseRdzvConf(std::string_view text) {
  std::map<std::string, std::string> conf;
  std::string_view s = Trim(text);
  if (s.empty()) return conf;
  for (std::string_view kv : Split(s, ',')) {
    size_t eq = kv.find('=');
    std::string_view key = Trim(kv.substr(0, eq));
    if (key.empty()) return Status::Error("expected <key1>=<value1>,...,<keyN>=<valueN> (an entry has no key)");
    std::string_view value = eq == std::string_view::npos ? std::string_view() : Trim(kv.substr(eq + 1));
    if (value.empty()) return Status::Error("option '" + std::string(key) + "' has no value");
    conf[std::string(key)] = std::string(value);
  }
  return conf;
}

StatusOr<std::vector<int>> ParseSignalList(std::string_view text) {
  if (Trim(text).empty()) return Status::Error("expected a comma-separated list of signal names");
  std::vector<int> out;
  for (std::string_view raw : Split(text, ',')) {
    std::string_view name = Trim(raw);
    if (name.empty()) return Status::Error("empty signal name in list");
    int sig = name.size() <= 16 ? SignalFromName(std::string(name)) : 0;
    if (sig == 0) return Status::Error("unknown signal '" + std::string(name) + "'");
    if (sig == SIGKILL || sig == SIGSTOP)
      return Status::Error(SignalName(sig) + " cannot be caught or forwarded");
    bool seen = false;
    for (int s : out) seen = seen || s == sig;
    if (!seen) out.push_back(sig);
  }
  return out;
}

StatusOr<int> ParsePort(std::string_view text) {
  auto p = ParseInt(text);
  if (!p) return Status::Error("expected a port number (1-65535)");
  if (*p < 1 || *p > 65535) return Status::Error("port must be in 1..65535");
  return *p;
}

StatusOr<std::string> ParseAddress(std::string_view text) {
  if (text.empty()) return Status::Error("the address must not be empty");
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close == 1) return Status::Error("unbalanced '[': expected [IPv6]");
    if (close + 1 != text.size())
      return Status::Error("an address takes no port here (give the port with its own flag, e.g. --master_port)");
    return std::string(text.substr(1, close - 1));
  }
  if (text.find_first_of("[]/ ") != std::string_view::npos) return Status::Error("not a host name or IP address");
  const size_t colon = text.find(':');
  if (colon != std::string_view::npos && text.find(':', colon + 1) == std::string_view::npos)
    return Status::Error("an address takes no port here (give the port with its own flag, e.g. --master_port)");
  return std::string(text);
}

StatusOr<std::vector<int>> ParseIndexList(std::string_view text) {
  // More than any machine has of GPUs or CPUs; bounds the work and the message of a typo.
  constexpr int kMaxIndex = 65535;
  std::vector<int> out;
  std::vector<bool> seen;
  if (text.empty()) return Status::Error("expected a list such as 0,2,3 or 0-3");
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const size_t dash = item.find('-', 1);
    auto first = ParseInt(item.substr(0, dash));
    auto last = dash == std::string_view::npos ? first : ParseInt(item.substr(dash + 1));
    if (!first.ok() || !last.ok() || *first < 0 || *last < *first)
      return Status::Error("'" + std::string(item) + "' is not an index or a range like 0-3");
    if (*last > kMaxIndex)
      return Status::Error("'" + std::string(item) + "': indices go up to " + std::to_string(kMaxIndex));
    if (seen.size() <= static_cast<size_t>(*last)) seen.resize(static_cast<size_t>(*last) + 1);
    for (int i = *first; i <= *last; ++i) {
      if (seen[static_cast<size_t>(i)]) return Status::Error(std::to_string(i) + " is listed twice");
      seen[static_cast<size_t>(i)] = true;
      out.push_back(i);
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

StatusOr<std::pair<int, int>> ParseDebugRank(std::string_view text) {
  const size_t colon = text.find(':');
  auto rank = ParseInt(text.substr(0, colon));
  if (!rank.ok() || *rank < 0) return Status::Error("expected a global rank (>= 0), optionally with :PORT");
  if (colon == std::string_view::npos) return std::make_pair(*rank, 0);
  auto port = ParsePort(text.substr(colon + 1));
  if (!port.ok()) return port.status();
  return std::make_pair(*rank, *port);
}

std::vector<std::string> SplitCommaEscaped(std::string_view text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::string cur;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',') {
      if (i + 1 < text.size() && text[i + 1] == ',') {
        cur.push_back(',');
        ++i;
      } else {
        out.push_back(std::move(cur));
        cur.clear();
      }
    } else {
      cur.push_back(text[i]);
    }
  }
  out.push_back(std::move(cur));
  return out;
}

}  // namespace ctrun
