// Std specs and rank filters: the values of torchrun's -r/--redirects and -t/--tee, and of
// --local-ranks-filter / ctrun's --ranks-filter. Pure parsing, no I/O.
//
// Std spec grammar (torchrun's Std.from_str, widened to multi-digit ranks):
//   "0".."3"                    one value for every local rank (0 none, 1 stdout, 2 stderr, 3 both)
//   "R:V,R:V,..."               per local rank; ranks not listed get 0 (none), like torchrun
// Rank filter grammar: "" (all ranks) or a comma list of ranks and inclusive ranges "0,2,4-7".
// Errors name the flag and the offending text.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "base/status.h"

namespace ctrun::logs {

enum class Std : uint8_t { kNone = 0, kOut = 1, kErr = 2, kAll = 3 };

inline bool HasStdout(Std s) { return (static_cast<uint8_t>(s) & 1) != 0; }
inline bool HasStderr(Std s) { return (static_cast<uint8_t>(s) & 2) != 0; }
inline Std operator|(Std a, Std b) {
  return static_cast<Std>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}

class StdSpec {
 public:
  StdSpec() = default;  // "0"
  static StatusOr<StdSpec> Parse(std::string_view text, std::string_view flag = "--redirects");
  Std ForRank(int local_rank) const;
  // Rank-wise OR (torchrun ORs tee into redirects).
  StdSpec Or(const StdSpec& other) const;
  bool AnySet() const;
  // Every stream this spec sets for a rank, `other` sets for that rank too.
  bool CoveredBy(const StdSpec& other) const;

 private:
  Std all_ = Std::kNone;         // applies to every rank (OR-ed with per_rank_)
  std::map<int, Std> per_rank_;  // explicit per-rank values
};

class RankFilter {
 public:
  RankFilter() = default;  // allows every rank
  static StatusOr<RankFilter> Parse(std::string_view text, std::string_view flag);
  bool Allows(int rank) const { return !ranks_ || ranks_->count(rank) != 0; }
  bool AllowsAll() const { return !ranks_; }

 private:
  std::optional<std::set<int>> ranks_;
};

}  // namespace ctrun::logs
