#include "base/environment.h"

#include <unordered_set>

extern char** environ;

namespace ctrun {

Environment Environment::FromEntries(const std::vector<std::string>& entries) {
  Environment env;
  env.vars_.reserve(entries.size());
  std::unordered_set<std::string_view> seen;  // not a scan per entry: environments can be huge
  seen.reserve(entries.size());
  for (const std::string& kv : entries) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string_view name(kv.data(), eq);
    if (!seen.insert(name).second) continue;  // the first entry wins, as with getenv
    env.vars_.emplace_back(std::string(name), kv.substr(eq + 1));
  }
  return env;
}

Environment Environment::FromProcess() {
  std::vector<std::string> entries;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) entries.emplace_back(*e);
  return FromEntries(entries);
}

size_t Environment::Find(std::string_view name) const {
  for (size_t i = 0; i < vars_.size(); ++i)
    if (vars_[i].first == name) return i;
  return vars_.size();
}

const std::string* Environment::Get(std::string_view name) const {
  const size_t i = Find(name);
  return i == vars_.size() ? nullptr : &vars_[i].second;
}

void Environment::Set(std::string_view name, std::string value) {
  if (const size_t i = Find(name); i != vars_.size()) {
    vars_[i].second = std::move(value);
    return;
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

void Environment::Unset(std::string_view name) {
  if (const size_t i = Find(name); i != vars_.size()) vars_.erase(vars_.begin() + static_cast<std::ptrdiff_t>(i));
}

void EraseEntries(std::vector<std::string>* entries, std::string_view name) {
  std::erase_if(*entries, [name](const std::string& e) {
    return e.size() > name.size() && e[name.size()] == '=' && std::string_view(e).starts_with(name);
  });
}

std::vector<std::string> Environment::Entries() const {
  std::vector<std::string> out;
  out.reserve(vars_.size());
  for (const auto& [name, value] : vars_) {
    std::string& kv = out.emplace_back();
    kv.reserve(name.size() + 1 + value.size());
    kv.append(name).append(1, '=').append(value);
  }
  return out;
}

}  // namespace ctrun
