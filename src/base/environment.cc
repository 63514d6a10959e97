#include "base/environment.h"

extern char** environ;

namespace ctrun {

Environment Environment::FromEntries(const std::vector<std::string>& entries) {
  Environment env;
  env.vars_.reserve(entries.size());
  for (const std::string& kv : entries) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    if (env.index_.count(name)) continue;  // the first entry wins, as with getenv
    env.index_.emplace(name, env.vars_.size());
    env.vars_.emplace_back(std::move(name), kv.substr(eq + 1));
  }
  return env;
}

Environment Environment::FromProcess() {
  std::vector<std::string> entries;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) entries.emplace_back(*e);
  return FromEntries(entries);
}

const std::string* Environment::Get(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &vars_[it->second].second;
}

void Environment::Set(std::string_view name, std::string value) {
  std::string key(name);
  if (auto it = index_.find(key); it != index_.end()) {
    vars_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, vars_.size());
  vars_.emplace_back(std::move(key), std::move(value));
}

void Environment::Unset(std::string_view name) {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return;
  vars_.erase(vars_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < vars_.size(); ++i) index_.emplace(vars_[i].first, i);
}

std::vector<std::string> Environment::Entries() const {
  std::vector<std::string> out;
  out.reserve(vars_.size());
  for (const auto& [name, value] : vars_) out.push_back(name + "=" + value);
  return out;
}

}  // namespace ctrun
