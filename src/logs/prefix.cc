#include "logs/prefix.h"

namespace ctrun::logs {
namespace {

std::string Pad(int v, int width) {
  std::string s = std::to_string(v);
  if (static_cast<int>(s.size()) < width) s.insert(0, static_cast<size_t>(width) - s.size(), '0');
  return s;
}

constexpr const char* kKnownNames = "role_name, rank, local_rank, host, node_rank, world_size";

TemplateLookup LabelLookup(const RankLabel& l) {
  return [&l](std::string_view name) -> std::optional<std::string> {
    if (name == "role_name") return l.role;
    if (name == "rank") return std::to_string(l.rank);
    if (name == "local_rank") return std::to_string(l.local_rank);
    if (name == "host") return l.host;
    if (name == "node_rank") return std::to_string(l.node_rank);
    if (name == "world_size") return std::to_string(l.world_size);
    return std::nullopt;
  };
}

}  // namespace

StatusOr<std::string> RenderPrefixTemplate(std::string_view t, const RankLabel& l) {
  auto r = Substitute(t, LabelLookup(l));
  if (!r.ok()) return Status::Error("prefix template: " + r.message() + " in '" + std::string(t) + "' (known: " + kKnownNames + ")");
  return r;
}

StatusOr<PrefixFormat> PrefixFormat::Choose(std::string_view log_prefix, const char* env_template,
                                            bool any_tee) {
  if (log_prefix == "none" || log_prefix == "inherit") return PrefixFormat(Kind::kNone, {});
  if (log_prefix == "rank") return Default();
  if (!log_prefix.empty()) {
    auto r = RenderPrefixTemplate(log_prefix, RankLabel{});
    if (!r.ok()) return r.status();
    return PrefixFormat(Kind::kTemplate, std::string(log_prefix));
  }
  if (env_template != nullptr) {
    // torchrun's variable: safe_substitute, as torchrun renders it; what stays as written is named.
    PrefixFormat f(Kind::kTemplate, env_template);
    if (auto r = RenderPrefixTemplate(env_template, RankLabel{}); !r.ok())
      f.warning_ = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: " + r.message() + "; it stays as written, as in torchrun";
    return f;
  }
  if (any_tee) return PrefixFormat(Kind::kTorchrunTee, {});
  return Default();
}

std::string PrefixFormat::Render(const RankLabel& l) const {
  switch (kind_) {
    case Kind::kNone:
      return {};
    case Kind::kTorchrunTee:
      return "[" + l.role + std::to_string(l.local_rank) + "]:";
    case Kind::kTemplate:
      // A --log-prefix passed the strict check in Choose (every name known, no stray '$'), so
      // rendering it safely gives the same text; torchrun's variable is rendered safely anyway.
      return SafeSubstitute(template_, LabelLookup(l));
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
