// An EnvLookup over a map, so CLI tests choose the environment the parser sees.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "cli/cli.h"

namespace ctrun::testing {

using Env = std::map<std::string, std::string>;

inline EnvLookup MapEnv(Env env) {
  return [env = std::move(env)](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace ctrun::testing
