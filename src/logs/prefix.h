// Console line prefixes for relayed worker output. Pure, no I/O.
//
// Which prefix a run uses (first match wins):
//   1. --log-prefix TEMPLATE   (ctrun; "none" = no prefix, "inherit" = see output_plan.h,
//      "rank" = the default prefix of 4., also where the console is not a terminal)
//   2. TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (torchrun >= 2.2), rendered as torchrun does
//   3. any --tee given: torchrun's tee header "[${role_name}${local_rank}]:" so tools written for
//      torchrun's tee output (sed on "[default0]:") keep working
//   4. ctrun's default: "[r07] " with the global rank zero-padded to the width of world_size-1,
//      and "[host r07] " in multi-node runs; shown only on a console stream that is a terminal
//      (OutputFlags::prefix_terminal_only): into a pipe or a file, worker lines reach ctrun's
//      stdout/stderr without one, as under torchrun, so scripts that parse them keep working.
// Templates follow Python's string.Template (base/py_template.h): ${name} or $name, "$$" is a
// literal '$'. Names: role_name, rank (global), local_rank (torchrun's), plus ctrun's host,
// node_rank, world_size. In --log-prefix an unknown name or a dangling '$' is an error (a typo
// stops the run before it starts); torchrun's variable goes through safe_substitute as in torchrun
// (they stay as written), with a warning naming them.
#pragma once

#include <string>
#include <string_view>

#include "base/py_template.h"
#include "base/status.h"

namespace ctrun::logs {

struct RankLabel {
  std::string role = "default";
  int rank = 0;        // global
  int local_rank = 0;
  int world_size = 1;
  int node_rank = 0;
  std::string host;    // short host name; shown by the default prefix only when multi_node
  bool multi_node = false;
};

// Renders a --log-prefix template strictly; the error names the bad placeholder.
StatusOr<std::string> RenderPrefixTemplate(std::string_view tmpl, const RankLabel& label);

class PrefixFormat {
 public:
  enum class Kind { kDefault, kTorchrunTee, kTemplate, kNone };

  // log_prefix: the --log-prefix value ("" = not given); env_template: the value of
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE or nullptr; any_tee: --tee is not "0".
  // Validates templates at once (against a sample label) so a typo fails before any spawn.
  static StatusOr<PrefixFormat> Choose(std::string_view log_prefix, const char* env_template,
                                       bool any_tee);
  static PrefixFormat Default() { return PrefixFormat(Kind::kDefault, {}); }

  Kind kind() const { return kind_; }
  // One line for the user when TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE has placeholders that stay as
  // written; "" otherwise.
  const std::string& warning() const { return warning_; }
  // The plain (uncoloured) prefix for one rank's console lines.
  std::string Render(const RankLabel& label) const;

 private:
  PrefixFormat(Kind k, std::string t) : kind_(k), template_(std::move(t)) {}
  Kind kind_;
  std::string template_;
  std::string warning_;
};

// "\x1b[..m" + prefix + "\x1b[0m" with a colour picked by rank; trailing spaces stay uncoloured.
std::string ColorizePrefix(const std::string& prefix, int rank);

}  // namespace ctrun::logs
