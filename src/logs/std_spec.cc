#include "logs/std_spec.h"

#include <charconv>

namespace ctrun::logs {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Non-negative decimal integer, the whole of s; at most 7 digits (ranks, not overflow games).
std::optional<int> ParseRank(std::string_view s) {
  if (s.empty() || s.size() > 7) return std::nullopt;
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

std::optional<Std> ParseStdValue(std::string_view s) {
  if (s.size() != 1 || s[0] < '0' || s[0] > '3') return std::nullopt;
  return static_cast<Std>(s[0] - '0');
}

Status Bad(std::string_view flag, std::string_view text, std::string_view why) {
  return Status::Error(std::string(flag) + ": invalid value '" + std::string(text) + "' (" +
                       std::string(why) + ")");
}

}  // namespace

StatusOr<StdSpec> StdSpec::Parse(std::string_view text, std::string_view flag) {
  std::string_view t = Trim(text);
  StdSpec spec;
  if (auto v = ParseStdValue(t)) {
    spec.all_ = *v;
    return spec;
  }
  if (t.empty()) return Bad(flag, text, "expected 0-3 or a map like 0:3,1:0");
  while (!t.empty()) {
    size_t comma = t.find(',');
    std::string_view item = Trim(t.substr(0, comma));
    t = comma == std::string_view::npos ? std::string_view() : t.substr(comma + 1);
    if (comma != std::string_view::npos && Trim(t).empty()) return Bad(flag, text, "trailing ','");
    size_t colon = item.find(':');
    if (colon == std::string_view::npos)
      return Bad(flag, text, item == Trim(text) ? "expected 0-3 or a map like 0:3,1:0" : "expected LOCAL_RANK:0-3 in a map");
    auto rank = ParseRank(Trim(item.substr(0, colon)));
    auto value = ParseStdValue(Trim(item.substr(colon + 1)));
    if (!rank) return Bad(flag, text, "bad local rank '" + std::string(item.substr(0, colon)) + "'");
    if (!value) return Bad(flag, text, "bad value '" + std::string(item.substr(colon + 1)) + "', expected 0-3");
    if (spec.per_rank_.count(*rank)) return Bad(flag, text, "local rank " + std::to_string(*rank) + " given twice");
    spec.per_rank_[*rank] = *value;
  }
  return spec;
}

Std StdSpec::ForRank(int local_rank) const {
  auto it = per_rank_.find(local_rank);
  return it == per_rank_.end() ? all_ : (all_ | it->second);
}

StdSpec StdSpec::Or(const StdSpec& other) const {
  StdSpec r = *this;
  r.all_ = all_ | other.all_;
  for (const auto& [rank, v] : other.per_rank_) r.per_rank_[rank] = r.per_rank_[rank] | v;
  return r;
}

bool StdSpec::AnySet() const {
  if (all_ != Std::kNone) return true;
  for (const auto& [rank, v] : per_rank_) {
    if (v != Std::kNone) return true;
  }
  return false;
}

bool StdSpec::CoveredBy(const StdSpec& other) const {
  auto subset = [](Std a, Std b) { return (a | b) == b; };
  // Ranks listed in neither map get all_ and other.all_; other's listed ranks only add to that.
  if (!subset(all_, other.all_)) return false;
  for (const auto& [rank, v] : per_rank_)
    if (!subset(all_ | v, other.ForRank(rank))) return false;
  return true;
}

StatusOr<RankFilter> RankFilter::Parse(std::string_view text, std::string_view flag) {
  RankFilter f;
  std::string_view t = Trim(text);
  if (t.empty()) return f;
  f.ranks_.emplace();
  while (!t.empty()) {
    size_t comma = t.find(',');
    std::string_view item = Trim(t.substr(0, comma));
    t = comma == std::string_view::npos ? std::string_view() : t.substr(comma + 1);
    size_t dash = item.find('-');
    auto lo = ParseRank(Trim(item.substr(0, dash)));
    auto hi = dash == std::string_view::npos ? lo : ParseRank(Trim(item.substr(dash + 1)));
    if (!lo || !hi || *hi < *lo) return Bad(flag, text, "expected ranks like 0,2,4-7");
    if (*hi - *lo > 1000000) return Bad(flag, text, "range too large");
    for (int r = *lo; r <= *hi; ++r) f.ranks_->insert(r);
  }
  return f;
}

}  // namespace ctrun::logs
