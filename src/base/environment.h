// Environment: a process environment read once into NAME -> VALUE, in the order of first
// appearance. Everything ctrun reads from its own environment, and every worker environment it
// builds, goes through this one reading of the "NAME=VALUE" entries:
//  - an entry without '=' is dropped;
//  - when a name occurs more than once the first entry wins, as with getenv(3), so a value seen
//    here is the value any getenv in ctrun sees; the others are dropped;
//  - Entries() gives back one "NAME=VALUE" per name, ready for execve.
// Lookups scan the entries: an environment holds tens of names, and every worker's is a copy of
// ctrun's with twenty set on top, so a copy without an index to rebuild is what matters (the
// agent makes one per worker per attempt: bench/core/worker_env_bench.cc).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ctrun {

class Environment {
 public:
  Environment() = default;
  static Environment FromEntries(const std::vector<std::string>& entries);
  static Environment FromProcess();  // ::environ

  // The value of `name`, or nullptr when it is not set.
  const std::string* Get(std::string_view name) const;
  bool Has(std::string_view name) const { return Get(name) != nullptr; }
  // Replaces the value in place (the entry keeps its position) or appends a new entry.
  void Set(std::string_view name, std::string value);
  // Removes `name` if set; the other entries keep their order.
  void Unset(std::string_view name);
  std::vector<std::string> Entries() const;
  size_t size() const { return vars_.size(); }

 private:
  // The position of `name` in vars_, or vars_.size().
  size_t Find(std::string_view name) const;
  std::vector<std::pair<std::string, std::string>> vars_;
};

// Removes every entry of `name` ("NAME=...") from a list of execve entries, such as a SpawnSpec's
// env; the others keep their order.
void EraseEntries(std::vector<std::string>* entries, std::string_view name);

}  // namespace ctrun
