// Python's string.Template, the substitution torchrun applies to worker arguments
// (`${local_rank}`) and to TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE. Pure.
//
// Syntax: "$$" is one '$'; "$name" and "${name}" are placeholders, name = [_A-Za-z][_A-Za-z0-9]*
// (ASCII; "$name" takes the longest such run). Any other '$' starts no placeholder ("$1", "$ ",
// "${x", a final '$').
//  - SafeSubstitute (safe_substitute): an unknown name or such a '$' stays exactly as written.
//  - Substitute (substitute): either is an error naming it, for ctrun's own templates, where a
//    typo should stop the run before it starts.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace ctrun {

// The value of a placeholder, or nullopt when `name` is unknown.
using TemplateLookup = std::function<std::optional<std::string>(std::string_view name)>;

std::string SafeSubstitute(std::string_view text, const TemplateLookup& lookup);

// Errors: "unknown placeholder '$name'" or "invalid placeholder at '<rest of the text>'".
StatusOr<std::string> Substitute(std::string_view text, const TemplateLookup& lookup);

}  // namespace ctrun
