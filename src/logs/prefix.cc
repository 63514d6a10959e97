#include "logs/prefix.h"

namespace ctrun::logs {
namespace {

bool IsIdentStart(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsIdentChar(char c) { return IsIdentStart(c) || (c >= '0' && c <= '9'); }

std::string Pad(int v, int width) {
  std::string s = std::to_string(v);
  if (static_cast<int>(s.size()) < width) s.insert(0, static_cast<size_t>(width) - s.size(), '0');
  return s;
}

}  // namespace

StatusOr<std::string> RenderPrefixTemplate(std::string_view t, const RankLabel& l) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '$') {
      out.push_back(t[i]);
      continue;
    }
    if (i + 1 < t.size() && t[i + 1] == '$') {
      out.push_back('$');
      ++i;
      continue;
    }
    std::string_view name;
    size_t next;
    if (i + 1 < t.size() && t[i + 1] == '{') {
      size_t close = t.find('}', i + 2);
      if (close == std::string_view::npos) return Status::Error("prefix template: unclosed '${' in '" + std::string(t) + "'");
      name = t.substr(i + 2, close - i - 2);
      next = close;
    } else {
      size_t j = i + 1;
      if (j < t.size() && IsIdentStart(t[j])) {
        while (j < t.size() && IsIdentChar(t[j])) ++j;
      }
      name = t.substr(i + 1, j - i - 1);
      next = j - 1;
    }
    if (name == "role_name") {
      out += l.role;
    } else if (name == "rank") {
      out += std::to_string(l.rank);
    } else if (name == "local_rank") {
      out += std::to_string(l.local_rank);
    } else if (name == "host") {
      out += l.host;
    } else if (name == "node_rank") {
      out += std::to_string(l.node_rank);
    } else if (name == "world_size") {
      out += std::to_string(l.world_size);
    } else {
      return Status::Error("prefix template: unknown placeholder '$" + std::string(name) + "' in '" +
                           std::string(t) +
                           "' (known: role_name, rank, local_rank, host, node_rank, world_size)");
    }
    i = next;
  }
  return out;
}

StatusOr<PrefixFormat> PrefixFormat::Choose(std::string_view log_prefix, const char* env_template,
                                            bool any_tee) {
  auto checked = [](std::string t) -> StatusOr<PrefixFormat> {
    auto r = RenderPrefixTemplate(t, RankLabel{});
    if (!r.ok()) return r.status();
    return PrefixFormat(Kind::kTemplate, std::move(t));
  };
  if (log_prefix == "none" || log_prefix == "inherit") return PrefixFormat(Kind::kNone, {});
  if (!log_prefix.empty()) return checked(std::string(log_prefix));
  if (env_template != nullptr) return checked(env_template);
  if (any_tee) return PrefixFormat(Kind::kTorchrunTee, {});
  return Default();
}

std::string PrefixFormat::Render(const RankLabel& l) const {
  switch (kind_) {
    case Kind::kNone:
      return {};
    case Kind::kTorchrunTee:
      return "[" + l.role + std::to_string(l.local_rank) + "]:";
    case Kind::kTemplate: {
      auto r = RenderPrefixTemplate(template_, l);
      return r.ok() ? *r : std::string();
    }
    case Kind::kDefault:
      break;
  }
  int width = static_cast<int>(std::to_string(l.world_size > 1 ? l.world_size - 1 : 0).size());
  std::string s = "[";
  if (l.multi_node && !l.host.empty()) s += l.host + " ";
  s += "r" + Pad(l.rank, width) + "] ";
  return s;
}

std::string ColorizePrefix(const std::string& prefix, int rank) {
  // Six readable foreground colours, then their bright variants: 12 distinct ranks side by side.
  static constexpr const char* kColors[] = {"36", "32", "33", "35", "34", "31",
                                            "96", "92", "93", "95", "94", "91"};
  if (prefix.empty()) return prefix;
  size_t end = prefix.find_last_not_of(' ');
  if (end == std::string::npos) return prefix;
  const char* c = kColors[static_cast<unsigned>(rank) % (sizeof kColors / sizeof kColors[0])];
  return std::string("\x1b[") + c + "m" + prefix.substr(0, end + 1) + "\x1b[0m" + prefix.substr(end + 1);
}

}  // namespace ctrun::logs
