#include "cli/cluster_env.h"

#include <array>
#include <cstdint>
#include <optional>
#include <utility>

#include "cli/value_parsers.h"

namespace ctrun {
namespace {

// --- hostlists ---------------------------------------------------------------------------------

constexpr std::string_view kSeparators = ", \t\n";
constexpr size_t kMaxDigits = 18;  // keeps every number, and HI - LO + 1, inside uint64_t

// LO-HI (or a single number: LO == HI), printed zero-padded to `width` digits.
struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;
};

// One piece of an entry: literal text, or a bracket group.
struct Piece {
  bool is_group = false;
  std::string text;           // when !is_group
  std::vector<Range> ranges;  // when is_group, in the order written
};
using Entry = std::vector<Piece>;

bool AllDigits(std::string_view s) {
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return !s.empty();
}

uint64_t Digits(std::string_view s) {
  uint64_t v = 0;
  for (char c : s) v = v * 10 + static_cast<uint64_t>(c - '0');
  return v;
}

// "7" or "01-04": one element of a bracket group.
StatusOr<Range> ParseRange(std::string_view s) {
  if (s.empty()) return Status::Error("empty element in a bracket group");
  size_t dash = s.find('-');
  std::string_view lo = s.substr(0, dash);
  std::string_view hi = dash == std::string_view::npos ? lo : s.substr(dash + 1);
  if (!AllDigits(lo) || !AllDigits(hi))
    return Status::Error("'" + std::string(s) + "' in a bracket group is not a number or a LO-HI range");
  if (lo.size() > kMaxDigits || hi.size() > kMaxDigits)
    return Status::Error("'" + std::string(s) + "' has more than " + std::to_string(kMaxDigits) + " digits");
  Range r{Digits(lo), Digits(hi), lo.size()};
  if (r.lo > r.hi) return Status::Error("reversed range '" + std::string(s) + "' (LO must not exceed HI)");
  return r;
}

// The inside of "[...]": comma-separated ranges.
StatusOr<std::vector<Range>> ParseGroup(std::string_view inside) {
  std::vector<Range> ranges;
  while (true) {
    size_t comma = inside.find(',');
    StatusOr<Range> r = ParseRange(inside.substr(0, comma));
    if (!r.ok()) return r.status();
    ranges.push_back(*r);
    if (comma == std::string_view::npos) return ranges;
    inside.remove_prefix(comma + 1);
  }
}

// The numbers one group stands for, saturating above kMaxHostlistHosts.
uint64_t GroupCount(const std::vector<Range>& ranges) {
  uint64_t n = 0;
  for (const Range& r : ranges) {
    n += r.hi - r.lo + 1;
    if (n > kMaxHostlistHosts) return kMaxHostlistHosts + 1;
  }
  return n;
}

// The hosts one entry stands for, saturating above kMaxHostlistHosts.
uint64_t EntryCount(const Entry& entry) {
  uint64_t n = 1;
  for (const Piece& p : entry) {
    if (!p.is_group) continue;
    n *= GroupCount(p.ranges);  // both factors <= kMaxHostlistHosts + 1: no overflow
    if (n > kMaxHostlistHosts) return kMaxHostlistHosts + 1;
  }
  return n;
}

// Splits `text` into entries of pieces; checks the brackets and the groups.
StatusOr<std::vector<Entry>> ParseHostlist(std::string_view text) {
  std::vector<Entry> entries;
  Entry entry;
  std::string literal;
  auto flush_literal = [&] {
    if (!literal.empty()) entry.push_back(Piece{false, std::move(literal), {}});
    literal.clear();
  };
  auto flush_entry = [&] {
    flush_literal();
    if (!entry.empty()) entries.push_back(std::move(entry));
    entry.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (kSeparators.find(c) != std::string_view::npos) {
      flush_entry();
    } else if (c == ']') {
      return Status::Error("']' at offset " + std::to_string(i) + " has no matching '['");
    } else if (c == '[') {
      size_t close = text.find(']', i + 1);
      size_t nested = text.find('[', i + 1);
      if (close == std::string_view::npos)
        return Status::Error("'[' at offset " + std::to_string(i) + " is never closed");
      if (nested < close)
        return Status::Error("'[' at offset " + std::to_string(nested) + " is inside another bracket group");
      StatusOr<std::vector<Range>> ranges = ParseGroup(text.substr(i + 1, close - i - 1));
      if (!ranges.ok()) return ranges.status();
      flush_literal();
      entry.push_back(Piece{true, "", std::move(*ranges)});
      i = close;
    } else {
      literal += c;
    }
  }
  flush_entry();
  return entries;
}

std::string Padded(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// Appends the hosts of `entry` to `out`, in Slurm's order (see ExpandHostlist). The caller has
// checked that there are at most kMaxHostlistHosts of them.
void ExpandEntry(const Entry& entry, std::vector<std::string>* out) {
  std::vector<std::vector<std::string>> values;  // per group, in order
  for (const Piece& p : entry) {
    if (!p.is_group) continue;
    std::vector<std::string> v;
    for (const Range& r : p.ranges)
      for (uint64_t n = r.lo;; ++n) {
        v.push_back(Padded(n, r.width));
        if (n == r.hi) break;
      }
    values.push_back(std::move(v));
  }
  const size_t groups = values.size();
  // Nesting from the slowest to the fastest group: next-to-last, ..., second, first, last.
  std::vector<size_t> order;
  for (size_t g = groups >= 2 ? groups - 1 : 0; g-- > 0;) order.push_back(g);
  if (groups > 0) order.push_back(groups - 1);

  std::vector<size_t> at(groups, 0);
  while (true) {
    std::string host;
    size_t g = 0;
    for (const Piece& p : entry) {
      if (p.is_group) {
        host += values[g][at[g]];
        ++g;
      } else {
        host += p.text;
      }
    }
    out->push_back(std::move(host));
    // Advance the odometer, fastest group first.
    size_t k = order.size();
    while (k > 0) {
      size_t grp = order[k - 1];
      if (++at[grp] < values[grp].size()) break;
      at[grp] = 0;
      --k;
    }
    if (k == 0) return;
  }
}

// --- Slurm -------------------------------------------------------------------------------------

constexpr int kTorchrunMasterPort = 29500;

// The options that settle the node layout; any of them means the user chose it.
constexpr std::array<std::string_view, 6> kNodeOptions = {"nnodes",        "node_rank",    "master_addr",
                                                          "rdzv_endpoint", "rdzv_backend", "standalone"};

Status Invalid(const std::string& var, const std::string& value, const std::string& reason) {
  return Status::Error("invalid value '" + value + "' for " + var + ": " + reason);
}

// The hint for a ctrun that srun did not start, in a job of several nodes; "" when there is none.
std::string NotInStepHint(const EnvLookup& env, const std::string& job_id) {
  for (const char* var : {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    std::optional<std::string> v = env(var);
    if (!v) continue;
    StatusOr<int> n = ParseInt(*v);
    if (!n.ok() || *n <= 1) return "";
    return "slurm: job " + job_id + " has " + std::to_string(*n) +
           " nodes, but srun did not start ctrun (SLURM_STEP_NODELIST is unset): running on this node "
           "only; 'srun --ntasks-per-node=1 ctrun ...' runs it on every node";
  }
  return "";
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view text) {
  StatusOr<std::vector<Entry>> entries = ParseHostlist(text);
  if (!entries.ok()) return entries.status();
  uint64_t total = 0;
  for (const Entry& e : *entries) {
    total += EntryCount(e);
    if (total > kMaxHostlistHosts)
      return Status::Error("more than " + std::to_string(kMaxHostlistHosts) + " hosts");
  }
  if (total == 0) return Status::Error("no host names");
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<size_t>(total));
  for (const Entry& e : *entries) ExpandEntry(e, &hosts);
  return hosts;
}

ExplicitFlags DetectExplicitFlags(const std::vector<std::string>& argv, const EnvLookup& env) {
  std::vector<std::string> dests = ExplicitOptionDests(argv, env);
  return ExplicitFlags{std::set<std::string>(dests.begin(), dests.end())};
}

Status ApplyClusterEnv(LaunchConfig* config, const EnvLookup& env, const ExplicitFlags& given,
                       std::string* notice) {
  notice->clear();
  std::optional<std::string> job_id = env("SLURM_JOB_ID");
  if (!job_id) return {};
  for (std::string_view dest : kNodeOptions)
    if (given.Has(dest)) return {};
  std::optional<std::string> nodelist = env("SLURM_STEP_NODELIST");
  std::optional<std::string> node_id = env("SLURM_NODEID");
  if (!nodelist || !node_id) {
    if (!nodelist) *notice = NotInStepHint(env, *job_id);
    return {};
  }

  StatusOr<std::vector<std::string>> hosts = ExpandHostlist(*nodelist);
  if (!hosts.ok()) return Invalid("SLURM_STEP_NODELIST", *nodelist, hosts.message());
  const int nodes = static_cast<int>(hosts->size());
  if (nodes == 1) return {};
  const std::string count_text = std::to_string(nodes) + " hosts";

  if (std::optional<std::string> v = env("SLURM_STEP_NUM_NODES")) {
    StatusOr<int> n = ParseInt(*v);
    if (!n.ok() || *n != nodes)
      return Invalid("SLURM_STEP_NUM_NODES", *v,
                     "SLURM_STEP_NODELIST '" + *nodelist + "' names " + count_text);
  }
  StatusOr<int> rank = ParseInt(*node_id);
  if (!rank.ok() || *rank < 0 || *rank >= nodes)
    return Invalid("SLURM_NODEID", *node_id,
                   "expected a node id from 0 to " + std::to_string(nodes - 1) + " (SLURM_STEP_NODELIST '" +
                       *nodelist + "' names " + count_text + ")");
  if (std::optional<std::string> v = env("SLURM_STEP_NUM_TASKS")) {
    StatusOr<int> n = ParseInt(*v);
    if (!n.ok()) return Invalid("SLURM_STEP_NUM_TASKS", *v, n.message());
    if (*n != nodes)
      return Invalid("SLURM_STEP_NUM_TASKS", *v,
                     "ctrun starts the workers of a whole node, so the step must run one ctrun per node "
                     "(srun --ntasks-per-node=1), not " +
                         *v + " tasks on " + std::to_string(nodes) + " nodes");
  }

  config->min_nodes = nodes;
  config->max_nodes = nodes;
  config->node_rank = *rank;
  config->master_addr = hosts->front();
  if (!config->master_port) config->master_port = kTorchrunMasterPort;
  *notice = "slurm: " + std::to_string(nodes) + " nodes (" + *nodelist + "), node rank " +
            std::to_string(*rank) + ", master " + config->master_addr + ":" +
            std::to_string(*config->master_port);
  return {};
}

}  // namespace ctrun
